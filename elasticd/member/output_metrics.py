"""--metrics-from-output: step and loss read from plain workers' output lines, for the console and `metrics`."""

from __future__ import annotations

import re
from typing import TypedDict

from elasticd.job.config import ConfigError

GROUPS = ("step", "loss", "epoch")


class LineFields(TypedDict, total=False):
    """What one output line states: any of its step, loss and epoch."""

    step: int
    loss: float
    epoch: int


def compile_pattern(text: str) -> re.Pattern[str]:
    """The user's REGEX, checked: it compiles and names `step` or `loss` (and optionally `epoch`)."""
    try:
        pattern = re.compile(text)
    except re.error as err:
        raise ConfigError(f"--metrics-from-output {text!r} is not a regular expression: {err}") from None
    if not {"step", "loss"} & set(pattern.groupindex):
        raise ConfigError(f"--metrics-from-output {text!r} names no (?P<step>...) or (?P<loss>...) group")
    return pattern


def parse_line(pattern: re.Pattern[str], line: str) -> LineFields | None:
    """The step, loss and epoch one output line states, or None when it states none (or garbles a number)."""
    match = pattern.search(line)
    if match is None:
        return None
    found = {k: v for k, v in match.groupdict().items() if k in GROUPS and v is not None}
    try:
        fields: LineFields = {"loss": float(found["loss"])} if "loss" in found else {}
        if "step" in found:
            fields["step"] = int(found["step"])
        if "epoch" in found:
            fields["epoch"] = int(found["epoch"])
    except ValueError:
        return None
    return fields or None
