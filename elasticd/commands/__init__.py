"""The control verbs, one module each; REGISTRY maps an op to its Command."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elasticd.coordinator import Coordinator

Handler = Callable[[Coordinator, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Command:
    name: str
    steer: bool  # changes the job: refused for viewers and under --readonly
    run: Handler
    summary: str


def _load() -> dict[str, Command]:
    from elasticd.commands import (
        checkpoint,
        cordon,
        drain,
        events,
        kill_worker,
        metrics,
        ranks,
        restart,
        scale,
        status,
        stop,
        workers,
    )

    modules = (status, ranks, workers, events, metrics, scale, drain, cordon, checkpoint, restart,
               kill_worker, stop)
    commands = [cmd for module in modules for cmd in module.COMMANDS]
    return {cmd.name: cmd for cmd in commands}


REGISTRY: dict[str, Command] = _load()
