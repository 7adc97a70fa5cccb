"""What a worker tells its daemon on the worker channel (docs/worker-channel.md): one record per op."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from elasticd.wire.heal_report import Heal
from elasticd.wire.names import WorkerOp
from elasticd.wire.record import Record


@dataclass(frozen=True)
class RankReport(Record):
    """What every worker frame says: the rank it speaks as (in its round, or in the generation it joins)."""

    rank: int


@dataclass(frozen=True)
class RankStep(RankReport):
    """A rank's step: trainer_shim's `step` frame (session.py writes it by hand, for speed: tests check the two
    agree), or the step and loss the daemon reads from a plain script's output (--metrics-from-output)."""

    step: int
    loss: float | None = None  # null: none reported, or not finite
    samples: int = 0
    tokens: int | None = None
    step_time: float | None = None  # seconds per step since the last report
    metrics: dict[str, float | None] = field(default_factory=dict)  # the script's own, and the shim's
    dropped: int = 0  # reports the shim dropped so far (the daemon did not read them in time)


@dataclass(frozen=True)
class Saved(RankReport):
    """`checkpoint`: a save completed (its step, where, how big, how long, and the request it answered)."""

    step: int
    path: str = ""
    bytes: int | None = None
    duration_s: float | None = None
    request_id: str | None = None


@dataclass(frozen=True)
class SaveSkipped(RankReport):
    """`checkpoint_skipped`: loading passed over a torn or corrupt file."""

    path: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Acked(RankReport):
    """`ack`: the rank saw a request."""

    request_id: str | None = None
    op: str = ""


@dataclass(frozen=True)
class Drained(RankReport):
    """`drained`: the rank saved and stopped for a drain; it exits 0 right after."""

    step: int | None = None
    request_id: str | None = None


@dataclass(frozen=True)
class Hello(RankReport):
    """`hello`: a worker is up as `rank` of `round`; again, with its new rank, each time it joins a generation."""

    local_rank: int = 0
    pid: int = 0
    round: int | None = None  # absent: the daemon's current round
    in_place: bool = False  # it resizes in place (trainer_shim.Elastic)
    waiting: bool = False  # started before its round: its rank is a placeholder until its `generation`
    welcome: bool = False  # a process's first hello, under a daemon that welcomes: answer with a `welcome`
    abort_signal: int | None = None  # what aborts its process group (trainer_shim/abort.py); the daemon sends it

    def inconsistency(self) -> str:
        if self.abort_signal is not None and not 0 < self.abort_signal < signal.NSIG:
            return f"abort_signal {self.abort_signal} is not a signal number"
        return ""


@dataclass(frozen=True)
class LeftGroup(RankReport):
    """`left`: the worker left its process group and waits for a generation."""

    pid: int
    round: int | None = None
    step: int | None = None  # the last completed step, which it holds
    request_id: str | None = None  # the `resize` it acted on
    error: str | None = None  # null: it left at the agreed step; else the collective error (a peer died)


@dataclass(frozen=True)
class Joined(RankReport):
    """`joined`: the worker is in generation `round`'s process group, with the freshest state."""

    pid: int
    round: int
    step: int | None = None  # the freshest step, which it now holds
    in_place: bool = False
    started: float | None = None  # wall-clock times; `started` only at a process's first generation
    last_step_at: float | None = None  # a kept rank: when its last completed step in the old group ended
    group_ready: float | None = None
    synced: float | None = None
    rebuild_s: float | None = None  # how long the script's `on_world` took in this generation
    collect_s: float | None = None  # the full garbage collection that freed its old world (trainer_shim.collection)
    state_s: float | None = None  # reading the state it heals (sharded: a fresh optimizer's state is made then)
    wait_s: float | None = None  # sharded: waiting for the slowest rank's rebuild, less the collection meanwhile
    restore_s: float | None = None  # the script's `load_state_dict` of the healed state
    heal: Heal | None = None


@dataclass(frozen=True)
class JoinFailed(RankReport):
    """`resize_failed`: joining generation `round` failed (its rebuild, the broadcast, the group's timeout)."""

    pid: int
    round: int | None = None
    reason: str | None = None


# From a rank of the node's round: a frame from an old round's worker is not acted on.
IN_ROUND: dict[str, type[RankReport]] = {WorkerOp.step: RankStep, WorkerOp.checkpoint: Saved,
                                         WorkerOp.checkpoint_skipped: SaveSkipped, WorkerOp.ack: Acked,
                                         WorkerOp.drained: Drained}
# From a worker between rounds: its rank and round are changing (elasticd/member/in_place.py).
BETWEEN_ROUNDS: dict[str, type[RankReport]] = {WorkerOp.left: LeftGroup, WorkerOp.joined: Joined,
                                               WorkerOp.resize_failed: JoinFailed}
FROM_WORKER: dict[str, type[RankReport]] = {WorkerOp.hello: Hello, **BETWEEN_ROUNDS, **IN_ROUND}
