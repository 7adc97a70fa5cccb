"""--metrics-from-output: step and loss read from plain workers' output lines, for the console and `metrics`."""

from __future__ import annotations

import re
from typing import Any

from elasticd.job.config import ConfigError

GROUPS = ("step", "loss", "epoch")


def compile_pattern(text: str) -> re.Pattern[str]:
    """The user's REGEX, checked: it compiles and names `step` or `loss` (and optionally `epoch`)."""
    try:
        pattern = re.compile(text)
    except re.error as err:
        raise ConfigError(f"--metrics-from-output {text!r} is not a regular expression: {err}") from None
    if not {"step", "loss"} & set(pattern.groupindex):
        raise ConfigError(f"--metrics-from-output {text!r} names no (?P<step>...) or (?P<loss>...) group")
    return pattern


def parse_line(pattern: re.Pattern[str], line: str) -> dict[str, Any] | None:
    """The step, loss and epoch one output line states, or None when it states none (or garbles a number)."""
    match = pattern.search(line)
    if match is None:
        return None
    found = {k: v for k, v in match.groupdict().items() if k in GROUPS and v is not None}
    try:
        fields: dict[str, Any] = {"loss": float(found["loss"])} if "loss" in found else {}
        fields.update({k: int(found[k]) for k in ("step", "epoch") if k in found})
    except ValueError:
        return None
    return fields or None
