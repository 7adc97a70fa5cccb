"""Heartbeats that carry changes: a member sends `workers`/`metrics`/`ports` only when the coordinator lacks them."""

from __future__ import annotations

import contextlib
import copy
import socket
from typing import Any

from elasticd.job.runtime import free_ports

PORT_COUNT = 4  # free ports a node offers the coordinator for a round's master port
# CPU, RSS, uptime and GPU numbers of worker records change every second but matter only as a trend: they
# travel at most this often; anything else in a record (a pid, a state, an exit code) travels at once.
SLOW_REFRESH_S = 10.0
SLOW_FIELDS = frozenset({"cpu_percent", "rss", "uptime_s", "gpu"})
DELTA_FIELDS = ("ports", "workers", "metrics")  # absent from a heartbeat: the coordinator keeps the last value
IN_FLIGHT = 8  # unanswered heartbeats remembered; an answer older than that is lost, and the fields go again


def stable(workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Worker records without their slowly-varying numbers: what must reach the coordinator at once."""
    return [{k: v for k, v in record.items() if k not in SLOW_FIELDS} for record in workers]


class BeatDiff:
    """What the coordinator holds of this node (the values of acknowledged heartbeats), and what it lacks.

    Each heartbeat has a number (`beat`) that the coordinator's `hb` answer echoes; a field counts as held only
    once a heartbeat that carried it is answered, so a dropped frame is sent again on the next beat.
    """

    def __init__(self) -> None:
        self.beat = 0
        self.held: dict[str, Any] = {}  # field -> the value the coordinator has
        self.workers_at = 0.0  # when the worker records the coordinator has were sent
        self.in_flight: dict[int, tuple[float, dict[str, Any]]] = {}  # beat -> (sent at, the fields it carried)

    def reset(self) -> None:
        """A (re-)registration: the coordinator starts from the register body and nothing else of ours."""
        self.held, self.in_flight, self.workers_at = {}, {}, 0.0

    def body(self, current: dict[str, Any], now: float) -> dict[str, Any]:
        """The heartbeat for `current` (every field's value now): the changed delta fields and all the others."""
        self.beat += 1
        out = {k: v for k, v in current.items() if k not in DELTA_FIELDS}
        carried = {k: current[k] for k in DELTA_FIELDS if k in current and self.lacks(k, current[k], now)}
        self.in_flight = {b: f for b, f in self.in_flight.items() if b > self.beat - IN_FLIGHT}
        # A snapshot: the node updates its metrics and worker records in place, and what the coordinator holds is
        # what this beat carried, not whatever those objects say later (else a change would never be sent).
        self.in_flight[self.beat] = (now, copy.deepcopy(carried))
        return {**out, **carried, "beat": self.beat}

    def lacks(self, key: str, value: Any, now: float) -> bool:
        if key not in self.held:
            return True
        held = self.held[key]
        if key != "workers" or held == value:
            return bool(held != value)
        return stable(held) != stable(value) or now - self.workers_at >= SLOW_REFRESH_S

    def ack(self, beat: Any) -> None:
        """The coordinator answered heartbeat `beat`: what it carried (and earlier ones carried) is held now."""
        if not isinstance(beat, int) or isinstance(beat, bool):
            return
        for number in sorted(b for b in self.in_flight if b <= beat):
            sent, fields = self.in_flight.pop(number)
            self.held.update(fields)
            if "workers" in fields:
                self.workers_at = sent


class PortPool:
    """Free ports this node offers; one stays offered while it is still free and no round made it a master port."""

    def __init__(self, host: str = "") -> None:
        self.host = host
        self.ports: list[int] = []
        self.taken: set[int] = set()  # master ports of rounds this node was sent: in use, or about to be

    def current(self) -> list[int]:
        """The offer now: the old ports that are still free, topped up with fresh ones (the same list if none moved)."""
        kept = [p for p in self.ports if p not in self.taken and self.free(p)]
        for _ in range(3):  # the kernel may hand out a port a round took but nobody binds yet: ask again
            if len(kept) >= PORT_COUNT:
                break
            kept += [p for p in free_ports(PORT_COUNT - len(kept), self.host) if p not in kept and p not in self.taken]
        self.ports = kept[:PORT_COUNT]
        return list(self.ports)

    def take(self, port: Any) -> None:
        if isinstance(port, int) and not isinstance(port, bool) and port > 0:
            self.taken.add(port)

    def free(self, port: int) -> bool:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((self.host, port))
            return True
        return False
