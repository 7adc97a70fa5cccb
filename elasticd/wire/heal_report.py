"""The `heal` a shim rank's `joined` carries (trainer_shim.heal): merged per node, then per in-place round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elasticd.wire.record import Record


@dataclass(frozen=True)
class Heal(Record):
    """What one rank's heal moved, and why its state came from the newest checkpoint instead (null: it did not)."""

    received_bytes: int = 0
    sent_bytes: int = 0
    senders: int = 0  # how many ranks it received from
    seconds: float = 0.0
    fallback: str | None = None


def merge_heals(heals: list[dict[str, Any]]) -> dict[str, Any]:
    """Ranks' (or nodes') heal reports as one: bytes summed, the longest time, the first fallback's reason."""
    def total(key: str) -> int:
        return sum(int(h.get(key) or 0) for h in heals)
    fallback = next((str(h["fallback"]) for h in heals if h.get("fallback")), None)
    return {"received_bytes": total("received_bytes"), "sent_bytes": total("sent_bytes"),
            "seconds": max(float(h.get("seconds") or 0.0) for h in heals), "fallback": fallback}
