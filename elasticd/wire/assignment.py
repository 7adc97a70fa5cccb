"""What the coordinator tells a member (docs/protocol.md §9.2): one record per op, decoded once where it arrives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from elasticd.wire.names import JobState, MeshOp, NodeState, job_prefix
from elasticd.wire.protocol import ErrorCode, JsonObject, ProtocolError
from elasticd.wire.record import Record


@dataclass(frozen=True)
class RoundAssignment(Record):
    """A `round`: this node's part in it (`state` running, or its role), or, with `round` null, why it waits."""

    round: int | None
    state: str = NodeState.waiting
    reason: str = ""
    group_rank: int | None = None
    group_world_size: int = 0
    ranks: list[int] = field(default_factory=list)
    world_size: int = 0
    master_addr: str = ""
    master_port: int = 0  # 0: none (a message without a round)
    restart_count: int = 0
    max_restarts: int = 0
    store_tunnel: str = ""  # rank 0's node's store tunnel ("" without --keys)
    node_restarts: dict[str, int] = field(default_factory=dict)  # this node's restarts by cause, for its metrics
    in_place: bool = False  # this node's shim workers keep their processes into the round
    store: str = ""  # the job's long-lived store, host:port ("" with --no-python)
    prefix: str = ""  # this generation's prefix in it
    prewarm: bool = False  # a standby of an in-place job: its workers start now and wait, ready to join
    expected_world: int = 0  # with `prewarm`: the world its pre-started workers rehearse (the job's, and this node)
    job_store_tunnel: str = ""  # with --keys: the job store, reached through this node's relay

    def inconsistency(self) -> str:
        if self.round is not None and self.world_size < 1:
            return f"round {self.round} has world_size {self.world_size}"
        return ""

    @property
    def job_prefix(self) -> str:
        return job_prefix(self.prefix)


class NodePart(TypedDict):
    """The fields of a round's `RoundAssignment` that differ from node to node. A round goes to every member as its
    shared fields, encoded once, with each node's part over them: building 2,048 records cost a round 8 ms more."""

    state: str
    group_rank: int | None
    ranks: list[int]
    node_restarts: dict[str, int]
    prewarm: bool
    expected_world: int


def with_part(shared: JsonObject, part: NodePart) -> JsonObject:
    """One node's `round` body: the round's shared fields (`RoundAssignment.encode`) with the node's part over them."""
    return {**shared, **cast(JsonObject, part)}  # a NodePart holds JSON values only


@dataclass(frozen=True)
class Welcome(Record):
    """The answer to `register`: welcomed in a role, or refused with why."""

    ok: bool
    role: str = NodeState.active
    round: int = 0
    events_pub: str = ""
    prewarm: bool = False
    expected_world: int = 0  # with `prewarm`: the world its pre-started workers rehearse (the job's, and this node)
    via: str = ""  # in a job with relays: the relay to send through
    store: str = ""  # with `prewarm`: the job's store, host:port, where pre-started workers read the state's size
    prefix: str = ""  # with `store`: the job's keys' prefix in it
    job_store_tunnel: str = ""  # with `store` and --keys: the store, reached through this node's relay
    errno: int = 0
    code: str = ""
    reason: str = "registration refused"

    @classmethod
    def refusal(cls, err: ProtocolError) -> Welcome:
        return cls(False, errno=err.errno, code=ErrorCode.NAMES.get(err.errno, "error"), reason=err.reason)

    def encode(self) -> dict[str, Any]:
        """Small on purpose: a welcome without a refusal's fields, a refusal without a welcome's."""
        sent = _WELCOMED if self.ok else _REFUSED
        return {k: v for k, v in vars(self).items() if k in sent and (v or k not in _WITH_STORE)}


_WITH_STORE = frozenset({"store", "prefix", "job_store_tunnel"})  # a prewarm's only
_WELCOMED = frozenset({"ok", "role", "round", "events_pub", "prewarm", "expected_world", "via"}) | _WITH_STORE
_REFUSED = frozenset({"ok", "errno", "code", "reason"})


@dataclass(frozen=True)
class CoordinatorBeat(Record):
    """`hb`: the coordinator is there; `beat` is the member's heartbeat it answers (absent in a sign of life)."""

    seq: int = 0
    round: int | None = None
    beat: int | None = None


@dataclass(frozen=True)
class Unknown(Record):
    """`unknown`: the coordinator does not know this daemon (it took over, or the node was lost): register again."""


@dataclass(frozen=True)
class Left(Record):
    reason: str = "the coordinator let it go"


@dataclass(frozen=True)
class Go(Record):
    """`go`: the round's workers may start (every old worker of the job is gone)."""

    round: int


@dataclass(frozen=True)
class Probe(Record):
    """`probe`: answer `pong` (a rank failed; the coordinator asks who else is there)."""

    round: int | None = None


@dataclass(frozen=True)
class JobEnd(Record):
    """The job is over; a failed one names its root cause and what followed (wire/diagnosis.py `Failure` bodies)."""

    state: str = JobState.failed
    reason: str = ""
    root_cause: dict[str, Any] | None = None
    consequences: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class StepQuestion(Record):
    """`step_query`: the node answers `step_report` with its highest shim step of the round."""

    op_id: str


@dataclass(frozen=True)
class WorkerRequest(Record):
    """`drain_workers`, `checkpoint_workers` (and `resize_workers`): the node's shim ranks act at `at_step`."""

    request_id: str
    at_step: int | None = None


@dataclass(frozen=True)
class ResizeRequest(WorkerRequest):
    """`resize_workers`: the ranks leave their group at `at_step`; `all_stay`: every node of the world is in the next
    one (a join), so a sharded rank gathers none of its shards first."""

    all_stay: bool = False


@dataclass(frozen=True)
class KillWorker(Record):
    rank: int


@dataclass(frozen=True)
class RelayRoute(Record):
    """`relay`: send through this relay's endpoint from now on ("": directly to the coordinator)."""

    via: str = ""


@dataclass(frozen=True)
class NodeQuery(Record):
    """`node_query`: an operator's `logs` or `stacks` request for this node, to answer with `node_answer`."""

    id: str
    op: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Fenced(Record):
    """With `--rdzv-backend etcd`, every message the coordinator sends carries its epoch (docs/protocol.md §9.4)."""

    epoch: int = 0


TO_MEMBER: dict[str, type[Record]] = {
    MeshOp.welcome: Welcome, MeshOp.hb: CoordinatorBeat, MeshOp.unknown: Unknown, MeshOp.left: Left,
    MeshOp.round: RoundAssignment, MeshOp.go: Go, MeshOp.job_end: JobEnd, MeshOp.probe: Probe,
    MeshOp.step_query: StepQuestion, MeshOp.drain_workers: WorkerRequest, MeshOp.checkpoint_workers: WorkerRequest,
    MeshOp.resize_workers: ResizeRequest, MeshOp.kill_worker: KillWorker, MeshOp.relay: RelayRoute,
    MeshOp.node_query: NodeQuery,
}
