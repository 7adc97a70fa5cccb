"""What a member tells the coordinator of itself (docs/protocol.md §9.1): joining, beats, events, failures, rounds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

from msgspec import Struct
from msgspec import field as struct_field

from elasticd.wire.diagnosis import ErrorInfo, Failure
from elasticd.wire.heal_report import Heal
from elasticd.wire.names import EventKind, MeshOp
from elasticd.wire.record import Record

NUMBERED = frozenset({"seq", "ts", "kind", "node"})  # an event's fields the job log sets itself


@dataclass(frozen=True)
class Scheduler(Record):
    """The SLURM step a node runs in (job/slurm.py), as its `node_joined` event says it."""

    kind: str = ""
    job_id: str = ""
    step_id: str = ""
    restart_count: int = 0  # how often SLURM requeued the job


class Register(Struct, Record, frozen=True):
    """`register`: a daemon asks to join, with where it is reached, its free ports and its place in the rank map."""

    instance: str
    host: str
    nproc: int
    node_rank: int = -1  # torchrun's --node-rank; -1: none
    ports: list[int] = struct_field(default_factory=list)
    control: str = ""
    pub: str = ""
    store_tunnel: str = ""  # with --keys: where other nodes reach its round store
    relay: str = ""  # in a job with relays: its relay ROUTER
    scheduler: Scheduler | None = None


class GpuUse(TypedDict, total=False):
    """A worker's GPU as NVML reads it (member/gpu.py); a field NVML cannot read is null."""

    index: int
    util_percent: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    temp_c: float | None
    power_w: float | None
    proc_mem_bytes: int | None


class WorkerInfo(TypedDict, total=False):
    """A worker process as its daemon last saw it (`workers`); `gpu` only where NVML is (null: on no GPU)."""

    pid: int
    local_rank: int
    rank: int
    state: str
    exit_code: int | None
    cpu_percent: float
    rss: int
    uptime_s: float
    log: str
    round: int
    gpu: GpuUse | None


class SaveMark(TypedDict, total=False):
    """A rank's last checkpoint: the `checkpoint` it reported, and when."""

    step: int
    path: str
    bytes: int | None
    duration_s: float | None
    at: float


class RankReport(TypedDict, total=False):
    """What a rank last reported in the round (member/rank_reports.py): its hello, steps, saves, drain."""

    rank: int
    round: int
    hello: float
    last_step_at: float
    in_place: bool
    source: str  # `output`: its steps are read from its output lines (--metrics-from-output)
    step: int
    loss: float | None
    samples: int
    tokens: int | None
    step_time: float | None
    dropped: int
    extra: dict[str, float | None]  # the script's own metrics, and the shim's
    throughput: float
    last_checkpoint: SaveMark
    drained_step: int | None
    last_ack: str | None


class Heartbeat(Struct, Record, frozen=True):
    """`hb`: the member is there; `ports`, `workers` and `metrics` only when the coordinator lacks them (None: it
    keeps what it holds), `via` only in a job with relays."""

    instance: str = ""
    beat: int | None = None
    state: str = ""
    round: int | None = None  # the round its workers are in
    assigned: int | None = None  # the newest round it was sent
    via: str | None = None
    via_failed: str = ""
    ports: list[int] | None = None
    workers: list[WorkerInfo] | None = None
    metrics: dict[str, RankReport] | None = None  # by rank


@dataclass(frozen=True)
class EventReport(Record):
    """`event`, and each of a `round_progress`'s `events`: a node's event for the job log; `fields`, its kind's own,
    are flat in the body beside `kind` and `ts` (a `seq` or `node` there is the job log's to set)."""

    kind: str = EventKind.unknown
    ts: float = 0.0
    fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def _decode(cls, body: object, op: str, path: str) -> EventReport:
        event = super()._decode(body, op, path)
        assert isinstance(body, dict)  # the record's decode refuses anything else
        cls._settled(event, body)
        return event

    @classmethod
    def _settled(cls, record: Any, body: dict[str, Any]) -> None:
        object.__setattr__(record, "fields", {k: v for k, v in body.items() if k not in NUMBERED})

    def encode(self) -> dict[str, Any]:
        return {"kind": self.kind, "ts": self.ts, **self.fields}


@dataclass(frozen=True)
class WorkerFailed(Record):
    """`worker_failed`: a rank of the node failed or hung (wire/diagnosis.py `Failure`, with when it was seen)."""

    round: int
    rank: int | None = None  # None: no rank's own (a spawn, a store)
    reason: str | None = None  # None: not said (the round's detail names the node)
    detected: float | None = None  # when its node saw it (None: when the coordinator heard of it)
    hang: bool = False
    exit_code: int | None = None
    signal: str = ""
    pid: int = 0
    at: float = 0.0
    error: ErrorInfo | None = None
    log: str = ""
    error_file: str = ""

    def failure(self, node: str) -> Failure:
        """The failure as events and `status` carry it, of the node that sent it."""
        return Failure(node, self.rank, self.round, self.exit_code, self.signal, self.pid, self.detected or self.at,
                       self.error, self.hang, self.reason or "", self.log, self.error_file).clipped()


class ProgressReport(Struct, Record, frozen=True):
    """`round_progress`: one step of the node's part in a round, with the node's events that go with it; a phase the
    report is not about is left out of its body."""

    round: int
    stopped: float | None = None  # its old workers are gone (or out of their group, in place)
    spawned: float | None = None  # its new workers are up
    last_step_at: float | None = None  # in place: the earliest of its kept ranks' last step in the old group
    # In place, once every rank said `joined`: its last rank to say so (the critical one), its times and parts
    group_ready: float | None = None
    synced: float | None = None
    rebuild_s: float | None = None  # the script's `on_world`
    collect_s: float | None = None  # the collection of its old world
    state_s: float | None = None  # reading the state it heals
    wait_s: float | None = None  # waiting for the slowest rank's rebuild (sharded)
    restore_s: float | None = None  # the script's `load_state_dict`
    in_place: bool = False
    heal: Heal | None = None
    events: list[EventReport] = struct_field(default_factory=list)

    @classmethod
    def _settled(cls, record: Any, body: dict[str, Any]) -> None:
        if record.events:  # most reports carry none: 4,096 of them in a join round at 2,048 nodes
            for event, sent in zip(record.events, body["events"], strict=True):
                EventReport._settled(event, sent)

    def encode(self) -> dict[str, Any]:
        return {k: v for k, v in super().encode().items() if v is not None}


STATE_REPORTS: dict[str, type[Record]] = {
    MeshOp.register: Register, MeshOp.hb: Heartbeat, MeshOp.event: EventReport, MeshOp.worker_failed: WorkerFailed,
    MeshOp.round_progress: ProgressReport,
}

