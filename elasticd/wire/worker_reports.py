"""What a worker tells its daemon on the worker channel (docs/worker-channel.md), for the ops typed so far."""

from __future__ import annotations

from dataclasses import dataclass, field

from elasticd.wire.names import WorkerOp
from elasticd.wire.record import Record


@dataclass(frozen=True)
class RankStep(Record):
    """A rank's step: trainer_shim's `step` frame (session.py writes it by hand, for speed: tests check the two
    agree), or the step and loss the daemon reads from a plain script's output (--metrics-from-output)."""

    rank: int
    step: int
    loss: float | None = None  # null: none reported, or not finite
    samples: int = 0
    tokens: int | None = None
    step_time: float | None = None  # seconds per step since the last report
    metrics: dict[str, float | None] = field(default_factory=dict)  # the script's own, and the shim's
    dropped: int = 0  # reports the shim dropped so far (the daemon did not read them in time)


@dataclass(frozen=True)
class Saved(Record):
    """`checkpoint`: a save completed (its step, where, how big, how long, and the request it answered)."""

    rank: int
    step: int
    path: str = ""
    bytes: int | None = None
    duration_s: float | None = None
    request_id: str | None = None


@dataclass(frozen=True)
class SaveSkipped(Record):
    """`checkpoint_skipped`: loading passed over a torn or corrupt file."""

    rank: int
    path: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Acked(Record):
    """`ack`: the rank saw a request."""

    rank: int
    request_id: str | None = None
    op: str = ""


@dataclass(frozen=True)
class Drained(Record):
    """`drained`: the rank saved and stopped for a drain; it exits 0 right after."""

    rank: int
    step: int | None = None
    request_id: str | None = None


IN_ROUND: dict[str, type[Record]] = {WorkerOp.step: RankStep, WorkerOp.checkpoint: Saved,
                                     WorkerOp.checkpoint_skipped: SaveSkipped, WorkerOp.ack: Acked,
                                     WorkerOp.drained: Drained}
