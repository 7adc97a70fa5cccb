"""Replies of the verbs that look (docs/protocol.md §5): `status`, `ranks`, `workers`, `events`, `metrics`, `goodput`,
`logs`, `stacks`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

from elasticd.wire.member_state import RankReport, WorkerInfo
from elasticd.wire.record import Record


@dataclass(frozen=True, kw_only=True)
class Reply(Record):
    """A verb's answer to a request it served (`ok: true`; one it did not is an `ErrorReply`)."""

    ok: bool = True


class RankEntryInfo(TypedDict):
    """One member of a round: its node, group rank and global ranks."""

    node_id: str
    group_rank: int
    host: str
    ranks: list[int]


class RoundInfo(TypedDict):
    """A round as `ranks` and `status` show it; `timeline` in absolute Unix times."""

    round_id: int
    members: list[RankEntryInfo]
    world_size: int
    master_addr: str
    master_port: int
    cause: str
    detail: str
    started_at: float
    timeline: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class RanksReply(Reply):
    """`ranks`: the current round (null before the first) and the recent ones, oldest first."""

    round: RoundInfo | None = None
    history: list[RoundInfo] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class WorkersReply(Reply):
    """`workers`: each alive node's workers, as its last heartbeat said."""

    nodes: dict[str, list[WorkerInfo]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class EventsReply(Reply):
    """`events`: the events asked for, ascending `seq`, each in the form of §6.1; `seq`, the log's newest."""

    events: list[dict[str, Any]] = field(default_factory=list)  # flat: its kind's fields beside seq, ts, kind, node
    seq: int = 0


class RankRow(TypedDict):
    """One rank of `metrics`: its step, loss, throughput, its last save, and its smoothed allreduce wait."""

    node: str
    rank: int | None
    round: int | None
    step: int | None
    loss: float | None
    throughput: float | None
    step_age_s: float
    dropped: int
    checkpoint_step: int | None
    checkpoint_path: str | None
    checkpoint_bytes: int | None
    checkpoint_duration_s: float | None
    checkpoint_age_s: float | None
    wait_s: float | None


@dataclass(frozen=True, kw_only=True)
class MetricsReply(Reply):
    """`metrics`: a row per rank that reports through trainer_shim, sorted by rank."""

    ranks: list[RankRow] = field(default_factory=list)


class LogEntry(TypedDict, total=False):
    """One rank's output in `logs`: where it comes from, and its lines; `offset` is where a follower asks next."""

    rank: int
    pid: int | None
    state: str
    exit_code: int | None
    path: str
    source: str  # file, or memory (the file was unreadable)
    note: str
    skipped: int  # bytes a follower far behind skipped
    lines: list[str]
    offset: int


@dataclass(frozen=True, kw_only=True)
class NodeAnswer(Reply):
    """What a node answers of its own workers (`logs`, `stacks`): which node, and the round it read."""

    node: str
    round: int


@dataclass(frozen=True, kw_only=True)
class LogsReply(NodeAnswer):
    """`logs`: each rank's lines."""

    ranks: list[LogEntry] = field(default_factory=list)


class StackEntry(TypedDict):
    """One rank's stacks in `stacks`: `where` its main thread is, the dump, or a note saying why there is none."""

    rank: int
    pid: int
    where: str
    text: str
    note: str


@dataclass(frozen=True, kw_only=True)
class StacksReply(NodeAnswer):
    """`stacks`: each rank's dump, in the node's newest round."""

    ranks: list[StackEntry] = field(default_factory=list)


class Buckets(TypedDict):
    """Seconds by bucket over a stretch of the job: recovery by reason; their sum; the wall-time training share."""

    training: float
    checkpoint: float
    redone: float
    waiting: float
    recovery: dict[str, float]
    accounted_s: float
    training_share: float | None


class WindowBuckets(Buckets, total=False):
    seconds: float  # the window's length


class NodeGoodput(TypedDict):
    """One node's own time in the job: its goodput, its seconds in the job, idle, and lost by bucket."""

    node: str
    goodput: float | None
    seconds: float
    idle: float
    lost: dict[str, float]


class GoodputTimeline(TypedDict):
    """The window in equal slices from `start`, each {bucket: seconds}."""

    start: float
    width_s: float
    bins: list[dict[str, float]]


@dataclass(frozen=True, kw_only=True)
class GoodputReply(Reply):
    """`goodput`: the share of rank time that trained, where the rest went over the job's life and the last hour,
    the nodes with the lowest goodput, and the window's timeline."""

    goodput: float | None
    redone_steps: int
    wall_s: float
    life: Buckets
    window: WindowBuckets
    nodes: list[NodeGoodput]
    idle_node_s: float
    timeline: GoodputTimeline


class NodeRow(TypedDict, total=False):
    """One node of `status`: who and where it is, its role and state, its workers, reports, restarts and health."""

    node_id: str
    host: str
    nproc: int
    instance: str
    joined_seq: int
    node_rank: int
    role: str
    status: str
    last_seen: float
    last_seen_age_s: float
    control: str
    pub: str
    store_tunnel: str
    relay_endpoint: str
    via: str
    workers: list[WorkerInfo]
    metrics: dict[str, RankReport]
    restarts: dict[str, int]
    checks: list[str]
    health: list[str]
    spare: str


class EtcdHealth(TypedDict):
    """`status.etcd`, with --rdzv-backend etcd: etcd's health as the coordinator sees it."""

    ok: bool
    since: float
    detail: str
    endpoints: list[str]
    access: str
    outage_limit_s: float


ETCD_ONLY = ("rdzv_backend", "epoch", "etcd")  # absent from a job on the embedded coordinator


@dataclass(frozen=True, kw_only=True)
class StatusReply(Reply):
    """`status`: the job, its round and restarts, one page of its nodes, and `seq`, the newest event it includes.
    What came after the protocol's first fields has a default: a daemon from before them still answers."""

    job_id: str
    state: str
    round: int
    world_size: int
    min_nodes: int
    max_nodes: int
    target: int
    coordinator: str
    restarts: dict[str, int]
    max_restarts: int
    nodes: list[NodeRow]
    seq: int
    reason: str = ""
    scheduler: dict[str, Any] = field(default_factory=dict)
    last_recovery: dict[str, float] = field(default_factory=dict)
    rank_map: list[RankEntryInfo] = field(default_factory=list)
    nodes_total: int = 0
    nodes_offset: int = 0
    node_counts: dict[str, int] = field(default_factory=dict)
    relays: int = 0
    goodput: float | None = None
    stragglers: dict[str, dict[str, float]] = field(default_factory=dict)
    root_cause: dict[str, Any] | None = None
    spares: dict[str, int] = field(default_factory=dict)
    unhealthy: list[str] = field(default_factory=list)
    refused_keys: int = 0  # added by the daemon that answers (its own refusals)
    rdzv_backend: str | None = None
    epoch: int | None = None
    etcd: EtcdHealth | None = None

    def encode(self) -> dict[str, Any]:
        body = super().encode()
        for name in ETCD_ONLY:
            if body[name] is None:
                del body[name]
        return body
