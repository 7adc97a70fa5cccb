"""Liveness of a daemon from the age of its last sign of life: live, stale or missing."""

from __future__ import annotations

from elasticd.commands.render import format_bytes as format_bytes  # where the console has always found it

# Daemons beat every second (docs/protocol.md §6.4): one late beat is stale, three missed are missing,
# the same rule by which the coordinator declares a node lost.
STALE_AFTER_S = 1.5
MISSING_AFTER_S = 3.0


def liveness(age_s: float | None, connected: bool = True, status: str = "alive") -> str:
    """`live` under 1.5 s since a beat, `stale` under 3 s, else `missing`; left/lost nodes say so."""
    if status in ("left", "lost"):
        return status
    if age_s is None or not connected or age_s >= MISSING_AFTER_S:
        return "missing"
    return "live" if age_s < STALE_AFTER_S else "stale"


def format_age(age_s: float | None) -> str:
    """A short age: 0.4s, 12s, 3m05s, 2h10m; a dash when unknown."""
    if age_s is None:
        return "-"
    if age_s < 10:
        return f"{max(age_s, 0.0):.1f}s"
    if age_s < 60:
        return f"{age_s:.0f}s"
    if age_s < 3600:
        return f"{int(age_s // 60)}m{int(age_s % 60):02d}s"
    return f"{int(age_s // 3600)}h{int(age_s % 3600 // 60):02d}m"


SPARK_CHARS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 12


def sparkline(values: list[float], width: int = SPARK_WIDTH) -> str:
    """A unicode sparkline of the last `width` values, scaled to their own range."""
    tail = [v for v in values if v is not None][-width:]
    if not tail:
        return ""
    low, high = min(tail), max(tail)
    span = (high - low) or 1.0
    return "".join(SPARK_CHARS[min(7, int((v - low) / span * 7.999))] for v in tail)
