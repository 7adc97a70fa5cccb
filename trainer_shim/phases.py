"""Where this rank's time went in one change, from its group forming to its `joined` report (the `resize` parts)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

REBUILD = "rebuild_s"  # the script's `on_world`
STATE = "state_s"  # reading the state it heals (a sharded rank: a fresh optimizer's state is made here)
WAIT = "wait_s"  # a sharded rank's wait for the slowest rank's rebuild, less the collection run meanwhile
COLLECT = "collect_s"  # the full collection that freed the old world (trainer_shim.collection)
RESTORE = "restore_s"  # the script's `load_state_dict` of the healed state


class Phases:
    """Seconds per phase of the current change, by the names the `joined` report carries them under."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - began)

    def report(self) -> dict[str, float]:
        return {name: round(max(seconds, 0.0), 4) for name, seconds in self.seconds.items()}
