"""What a daemon asks of its workers on the worker channel (docs/worker-channel.md): one record per op, encoded
where it is sent (trainer_shim reads the bodies as plain dicts: tests check it takes these)."""

from __future__ import annotations

from dataclasses import dataclass

from elasticd.wire.names import WorkerOp
from elasticd.wire.record import Record


@dataclass(frozen=True)
class AtStep(Record):
    """`checkpoint`, `drain` (and `resize`): act at the first step boundary whose completed step reaches `at_step`
    (null: the next one)."""

    request_id: str
    at_step: int | None = None


@dataclass(frozen=True)
class Resize(AtStep):
    """`resize` after a crash or a loss: leave the group now, for generation `round` (a worker that joined it
    already drops the request: it crossed the worker's own `left`)."""

    round: int | None = None
    all_stay: bool = False  # every rank of the world is in the next one (a join): a sharded rank gathers nothing


@dataclass(frozen=True)
class Generation(Record):
    """`generation`: join this one as `rank` of `world_size`, on `PrefixStore(prefix, TCPStore(store))`."""

    round: int
    rank: int
    world_size: int
    local_rank: int
    group_rank: int | None  # the node's, as its round assignment says
    group_world_size: int
    store: str  # host:port of the job's long-lived store
    prefix: str


@dataclass(frozen=True)
class WorkerWelcome(Record):
    """`welcome`: the answer to a first hello that asks; `hold`: the round ends without this worker."""

    hold: bool = False


TO_WORKER: dict[str, type[Record]] = {WorkerOp.checkpoint: AtStep, WorkerOp.drain: AtStep,
                                      WorkerOp.resize: Resize, WorkerOp.generation: Generation,
                                      WorkerOp.welcome: WorkerWelcome}
