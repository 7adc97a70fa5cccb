"""Event fields for people: seconds to 3 significant digits, paths cut to their tail, node ids shortened."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from elasticd.commands.render import format_bytes, format_seconds, short_path, significant, span

NODE_LIST_FIELDS = ("nodes", "remaining", "joining")
HIDDEN_FIELDS = ("seq", "ts", "kind", "node", "timeline")


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


def event_fields(event: dict[str, Any], name: Callable[[str], str] = str) -> str:
    """`key=value` pairs of an event, each value formatted for reading (the raw event stays in the model)."""
    return " ".join(format_field(k, v, name) for k, v in event.items() if k not in HIDDEN_FIELDS)
