"""What every part of the coordinator sees of it: the job's config, node records and round, and how to send and record.

Each part (registration.py, liveness.py, relay_routes.py, probes.py, round_progress.py, transitions.py, status.py)
names in its own Protocol what else it needs; the Coordinator (coordinator.py) is the one object that has it all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from elasticd.coordinator.membership import NodeRecord, Round
from elasticd.job.config import JobConfig
from elasticd.wire.names import Cause, EventKind, JobState, MeshOp
from elasticd.wire.protocol import Json, JsonObject

Send = Callable[[str, MeshOp, JsonObject], None]  # (node_id, op, body)
SendAll = Callable[[list[str], MeshOp, JsonObject], None]  # one message to many: the mesh encodes it once


@dataclass
class PendingRound:
    """A round to start once the settle window passes; the first cause queued is the root cause."""

    cause: Cause
    detail: str
    detected_at: float
    due: float

    def wake_in(self, now: float, period: float) -> float:
        """How long a loop ticking every `period` sleeps: to `due` where it falls within the period (a broken
        round's short window), else the period. Past due, the round is held (a warm-up): no sooner."""
        left = self.due - now
        return left if 0 < left < period else period


class CoordinatorCore(Protocol):
    """The coordinator as each of its parts sees it: the job's state, its members, and the ways out."""

    cfg: JobConfig
    state: JobState
    round: Round | None
    send: Send
    send_all: SendAll
    clock: Callable[[], float]

    @property
    def nodes(self) -> dict[str, NodeRecord]: ...

    def alive(self) -> list[NodeRecord]: ...

    def emit(self, kind: EventKind, node: str = "", ts: float = 0.0, **fields: Json) -> JsonObject: ...
