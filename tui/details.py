"""Event fields for people: seconds to 3 significant digits, paths cut to their tail, node ids shortened."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tui.liveness import format_bytes
from tui.names import ELLIPSIS

PATH_WIDTH = 40
NODE_LIST_FIELDS = ("nodes", "remaining", "joining")
HIDDEN_FIELDS = ("seq", "ts", "kind", "node", "timeline")


def significant(value: float, digits: int = 3) -> str:
    """0.049312345 -> 0.0493, 0.8 -> 0.800, 1234.5 -> 1234 (no exponent for the sizes events carry)."""
    if value == 0 or abs(value) >= 10 ** (digits - 1):
        return f"{value:.0f}"
    if abs(value) < 1e-4:
        return f"{value:.{digits - 1}e}"
    return f"{value:#.{digits}g}".rstrip(".")  # '#' keeps the zeros of 0.800; 99.96 gives '100.'


def format_seconds(value: float | None) -> str:
    return "-" if value is None else f"{significant(float(value))} s"


def short_path(path: str, width: int = PATH_WIDTH) -> str:
    """The file name and as many parent folders as fit: `…/step-200/rank-3.pt`; a long file name keeps its end."""
    if len(path) <= width:
        return path
    parts = path.split("/")
    tail = parts[-1]
    for part in reversed(parts[:-1]):
        if len(part) + 1 + len(tail) + 2 > width:  # room for "…/" in front
            break
        tail = f"{part}/{tail}"
    if len(tail) + 2 > width:  # the file name alone is too long: keep its end (extension, step, rank)
        return ELLIPSIS + tail[len(tail) - width + 1:]
    return f"{ELLIPSIS}/{tail}"


def format_field(key: str, value: Any, name: Callable[[str], str]) -> str:
    """`key=value`; a duration (`duration_s`) drops its `_s` for a unit: `duration=0.0493 s`."""
    if key.endswith("_s") and isinstance(value, int | float) and not isinstance(value, bool):
        return f"{key.removesuffix('_s')}={format_seconds(value)}"
    return f"{key}={format_value(key, value, name)}"


def format_value(key: str, value: Any, name: Callable[[str], str]) -> str:
    if key == "ranks" and isinstance(value, list):
        return span(value)
    if key == "bytes" and isinstance(value, int):
        return format_bytes(value)
    if isinstance(value, float):
        return significant(value)
    if key.endswith("path") and isinstance(value, str):
        return short_path(value)
    if key in NODE_LIST_FIELDS and isinstance(value, list):
        return ",".join(name(str(v)) for v in value) or "-"
    if key == "rank_map" and isinstance(value, dict):
        return " ".join(f"{name(str(node))}:{span(list(ranks))}" for node, ranks in value.items())
    return str(value)


def span(ranks: list[int]) -> str:
    """0-3 for a contiguous run, else 0,2,5."""
    if not ranks:
        return "-"
    contiguous = ranks[-1] - ranks[0] == len(ranks) - 1
    return f"{ranks[0]}-{ranks[-1]}" if contiguous and len(ranks) > 1 else ",".join(map(str, ranks))


def event_fields(event: dict[str, Any], name: Callable[[str], str] = str) -> str:
    """`key=value` pairs of an event, each value formatted for reading (the raw event stays in the model)."""
    return " ".join(format_field(k, v, name) for k, v in event.items() if k not in HIDDEN_FIELDS)
