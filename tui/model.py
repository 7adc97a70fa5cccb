"""The headless job model: status, metrics, workers, events and heartbeats folded into plain dataclasses."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elasticd.wire.telemetry import StepTelemetry
from tui.diagnosis import RootCause
from tui.liveness import liveness
from tui.names import short_names
from tui.paging import PAGED_ABOVE, placeholder

Clock = Callable[[], float]
EVENT_HISTORY = 2000
LOSS_HISTORY = 600
PUSHED_FRESH_S = 5.0  # a rank reported by `st` this recently takes steps from `st` only, not from polled metrics


@dataclass
class RankView:
    """The latest trainer_shim report of one global rank."""

    rank: int
    node: str
    step: int | None = None
    loss: float | None = None
    throughput: float | None = None
    checkpoint_step: int | None = None
    checkpoint_at: float | None = None
    checkpoint_bytes: int | None = None
    checkpoint_duration_s: float | None = None
    checkpoint_path: str | None = None
    samples: int | None = None
    step_time: float | None = None
    last_step_at: float | None = None
    pushed_at: float | None = None  # when an `st` message last reported this rank
    updated_at: float = 0.0


@dataclass
class NodeView:
    """One node (daemon) as the console sees it."""

    node_id: str
    host: str = ""
    role: str = ""
    status: str = "alive"
    nproc: int = 0
    control: str = ""
    pub: str = ""
    ranks: list[int] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    kept: set[int] = field(default_factory=set)  # pids its last round kept in place (an in-place resize)
    last_seen: float | None = None
    heard_at: float | None = None  # the last heartbeat this console received itself (status is second-hand)
    daemon_state: str = ""
    connected: bool = True
    restarts: int = 0
    health: list[str] = field(default_factory=list)  # why its checks fail (`lemon: ...` too); [] when healthy
    spare: str = ""  # a standby's readiness to take a place: "ready", "warming: ..."; "" for other roles
    loss_history: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=LOSS_HISTORY))


@dataclass
class JobView:
    """The job header: state, round, sizes, restarts and the last recovery."""

    job_id: str = ""
    state: str = "connecting"
    reason: str = ""
    round: int = 0
    world_size: int = 0
    target: int = 0
    min_nodes: int = 0
    max_nodes: int = 0
    coordinator: str = ""
    epoch: int = 0  # --rdzv-backend etcd: the coordinator's election epoch (0: the embedded coordinator)
    restarts: dict[str, int] = field(default_factory=dict)
    max_restarts: int = 0
    last_recovery: dict[str, float] = field(default_factory=dict)
    goodput: float | None = None  # the share of the job's rank time that trained (`elasticd goodput`)
    seq: int = 0


class JobModel:
    """Everything known about one job; fed by the I/O workers, read by the views. Never does I/O."""

    def __init__(self, job_id: str = "", clock: Clock = time.time) -> None:
        self.clock = clock
        self.job = JobView(job_id=job_id)
        self.nodes: dict[str, NodeView] = {}
        self.rank_metrics: dict[int, RankView] = {}
        self.rank_map: list[dict[str, Any]] = []
        self.round_history: list[dict[str, Any]] = []
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENT_HISTORY)
        self.last_event_seq = 0
        self.connection = "connecting"
        self.version = 0
        self.step_seen_at: dict[tuple[str, int], float] = {}
        self.ranks_by_node: dict[str, dict[int, RankView]] = {}  # node id -> rank -> its metrics
        self.node_order: dict[str, int] = {}  # node id -> position in `nodes` (nodes are never removed)
        self.stragglers: dict[str, dict[str, Any]] = {}  # node id -> what it costs the job per step (`straggler`)
        self.root_cause: RootCause | None = None  # the newest failed round's first failure (`status`)
        self.goodput: dict[str, Any] = {}  # the `goodput` verb's last reply: lost time by cause, its timeline, nodes
        self.round_first_step: dict[int, int] = {}  # round -> the first step this console saw in it
        self.round_sizes: dict[int, int] = {}  # round -> world size, from round_started events
        self.round_in_place: dict[int, bool] = {}  # round -> its survivors kept their processes
        self.newest_checkpoint: RankView | None = None  # the rank whose checkpoint is the job's newest
        self.names: dict[int, tuple[int, dict[str, str]]] = {}  # width -> (node count, short names)
        self.nodes_total = 0  # nodes in the job, from `status` (more than `nodes` holds when it is paged)
        self.node_counts: dict[str, int] = {}  # `alive/active`, `alive/standby`, `lost`, `left` -> nodes
        self.joined: list[str | None] = []  # join order -> node id; None where no page has brought it yet
        self.layout = 0  # +1 whenever `joined` changes: the nodes table's keys are cached until then
        self.keys_cache: tuple[tuple[int, int, bool], list[str]] = ((-1, -1, False), [])
        self.rank_cells_cache: list[tuple[int, str]] | None = None  # the rank map as sorted (rank, node)

    def changed(self) -> None:
        self.version += 1

    def node(self, node_id: str) -> NodeView:
        node = self.nodes.get(node_id)
        if node is None:
            node = self.nodes[node_id] = NodeView(node_id)
            self.node_order[node_id] = len(self.node_order)
        return node

    def rank(self, rank: int, node: str) -> RankView:
        """The metrics of a rank, fresh when it moved to another node; kept indexed by node."""
        metrics = self.rank_metrics.get(rank)
        if metrics is None or metrics.node != node:
            if metrics is not None:
                self.ranks_by_node.get(metrics.node, {}).pop(rank, None)
            metrics = self.rank_metrics[rank] = RankView(rank, node)
            self.ranks_by_node.setdefault(node, {})[rank] = metrics
        return metrics

    # ---- replies ---------------------------------------------------------------------------------
    def apply_status(self, reply: dict[str, Any]) -> None:
        now = self.clock()
        job = self.job
        job.job_id = str(reply.get("job_id", job.job_id))
        job.state, job.reason = str(reply.get("state", "")), str(reply.get("reason", ""))
        job.round, job.world_size = int(reply.get("round", 0)), int(reply.get("world_size", 0))
        job.target, job.min_nodes = int(reply.get("target", 0)), int(reply.get("min_nodes", 0))
        job.max_nodes, job.coordinator = int(reply.get("max_nodes", 0)), str(reply.get("coordinator", ""))
        job.restarts, job.max_restarts = dict(reply.get("restarts", {})), int(reply.get("max_restarts", 0))
        job.epoch = int(reply.get("epoch", 0))
        job.last_recovery, job.seq = dict(reply.get("last_recovery") or {}), int(reply.get("seq", 0))
        self.stragglers = {str(n): dict(f) for n, f in dict(reply.get("stragglers") or {}).items()}
        self.root_cause = RootCause.from_body(reply.get("root_cause"))
        goodput = reply.get("goodput")
        job.goodput = float(goodput) if isinstance(goodput, int | float) and not isinstance(goodput, bool) else None
        rank_map = list(reply.get("rank_map", []))
        if rank_map != self.rank_map:
            self.rank_map, self.rank_cells_cache = rank_map, None
        ranks = {str(e.get("node_id")): list(e.get("ranks", [])) for e in self.rank_map}
        records = list(reply.get("nodes", []))
        self.nodes_total = int(reply.get("nodes_total", len(records)))
        self.node_counts = {str(k): int(v) for k, v in (reply.get("node_counts") or {}).items()}
        if self.paged:
            self.place(int(reply.get("nodes_offset", 0)), [str(r.get("node_id")) for r in records])
        for record in records:
            node = self.node(str(record.get("node_id")))
            node.host, node.role = str(record.get("host", "")), str(record.get("role", ""))
            node.status, node.nproc = str(record.get("status", "alive")), int(record.get("nproc", 0))
            node.control, node.pub = str(record.get("control", "")), str(record.get("pub", ""))
            node.ranks = ranks.get(node.node_id, [])
            node.health, node.spare = [str(r) for r in record.get("health") or []], str(record.get("spare") or "")
            if "workers" in record:  # a page carries its nodes' workers: no `workers` call for all of them
                node.workers = list(record.get("workers") or [])
            age = record.get("last_seen_age_s")
            if age is not None and node.status == "alive":
                node.last_seen = max(node.last_seen or 0.0, now - float(age))
        self.connection = "connected"
        self.changed()

    def place(self, offset: int, node_ids: list[str]) -> None:
        """A page of the node list: its nodes take their rows (join order); colours follow the rows."""
        if len(self.joined) != self.nodes_total:
            self.joined = (self.joined + [None] * self.nodes_total)[:self.nodes_total]
            self.layout += 1
        for index, node_id in enumerate(node_ids, offset):
            if index < len(self.joined) and self.joined[index] != node_id:
                self.joined[index] = node_id
                self.node_order[node_id] = index
                self.layout += 1

    def apply_metrics(self, reply: dict[str, Any]) -> None:
        now = self.clock()
        for item in reply.get("ranks", []):
            if item.get("rank") is None:
                continue
            metrics = self.rank(int(item["rank"]), str(item.get("node", "")))
            self.saw_step(item.get("round"), item.get("step"))
            if metrics.pushed_at is None or now - metrics.pushed_at > PUSHED_FRESH_S:  # `st` is newer: keep it
                self.update_rank(metrics.rank, metrics.node, item.get("step"), item.get("loss"), item.get("throughput"))
            if item.get("checkpoint_step") is not None:
                metrics.checkpoint_step = int(item["checkpoint_step"])
                metrics.checkpoint_path = item.get("checkpoint_path")
                if item.get("checkpoint_age_s") is not None:
                    metrics.checkpoint_at = now - float(item["checkpoint_age_s"])
                    self.saw_checkpoint(metrics)
        self.changed()

    def apply_workers(self, reply: dict[str, Any]) -> None:
        for node_id, workers in (reply.get("nodes") or {}).items():
            self.node(str(node_id)).workers = list(workers)
        self.changed()

    def apply_goodput(self, reply: dict[str, Any]) -> None:
        self.goodput = reply
        self.changed()

    def apply_ranks(self, reply: dict[str, Any]) -> None:
        self.round_history = list(reply.get("history", []))
        self.changed()

    def apply_history(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self.apply_event(event)

    # ---- telemetry -------------------------------------------------------------------------------
    def update_rank(self, rank: int, node: str, step: Any, loss: Any, throughput: Any) -> RankView:
        metrics = self.rank(rank, node)
        now = self.clock()
        if step is not None and step != metrics.step:
            metrics.step = int(step)
            self.step_seen_at[(node, rank)] = now
            if loss is not None:
                self.node(node).loss_history.append((int(step), float(loss)))
        metrics.loss = float(loss) if loss is not None else metrics.loss
        metrics.throughput = float(throughput) if throughput is not None else metrics.throughput
        metrics.updated_at = now
        return metrics

    def apply_heartbeat(self, node_id: str, body: dict[str, Any]) -> None:
        node = self.node(node_id)
        node.last_seen = node.heard_at = self.clock()
        node.connected = True
        node.daemon_state = str(body.get("state", node.daemon_state))
        self.changed()

    def apply_event(self, event: dict[str, Any]) -> bool:
        """Fold one numbered job event in; duplicates (the same event from another daemon) are ignored."""
        seq = int(event.get("seq", 0))
        if seq and seq <= self.last_event_seq:
            return False
        self.last_event_seq = max(self.last_event_seq, seq)
        self.events.append(event)
        kind, node_id = str(event.get("kind", "")), str(event.get("node", ""))
        if kind == "workers_started" and node_id:
            self.node(node_id).restarts = sum(1 for e in self.events if e.get("kind") == "workers_started"
                                              and e.get("node") == node_id) - 1
            self.node(node_id).kept = {int(pid) for pid in event.get("kept") or []}
        elif kind == "node_role" and node_id:
            self.node(node_id).role = str(event.get("role", ""))
        elif kind in ("node_unhealthy", "node_healthy") and node_id:
            self.node(node_id).health = [str(r) for r in event.get("reasons") or []]
        elif kind in ("node_lost", "node_left") and node_id:
            self.node(node_id).status = "lost" if kind == "node_lost" else "left"
        elif kind == "round_started":
            self.job.round, self.job.world_size = int(event.get("round", 0)), int(event.get("world_size", 0))
            self.round_sizes[self.job.round] = self.job.world_size
            self.round_in_place[self.job.round] = bool(event.get("in_place"))
        elif kind == "checkpoint_saved" and event.get("rank") is not None:
            self.apply_checkpoint(event)
        elif kind == "job_end":
            self.job.state = str(event.get("state", "ended"))
        self.changed()
        return True

    def apply_checkpoint(self, event: dict[str, Any]) -> None:
        rank = int(event["rank"])
        metrics = self.rank_metrics.get(rank) or self.rank(rank, str(event.get("node", "")))
        metrics.checkpoint_step = event.get("step", metrics.checkpoint_step)
        metrics.checkpoint_at = float(event.get("ts") or self.clock())
        metrics.checkpoint_bytes = event.get("bytes")
        metrics.checkpoint_duration_s = event.get("duration_s")
        metrics.checkpoint_path = event.get("path") or metrics.checkpoint_path
        self.saw_checkpoint(metrics)

    def saw_checkpoint(self, metrics: RankView) -> None:
        """Keep the job's newest checkpoint at hand: the header shows its age every frame."""
        newest = self.newest_checkpoint
        if newest is None or newest is metrics or (metrics.checkpoint_at or 0.0) >= (newest.checkpoint_at or 0.0):
            self.newest_checkpoint = metrics

    def apply_steps(self, node_id: str, steps: StepTelemetry) -> None:
        """Step telemetry (`st.<node>`, op `steps`, protocol §6.3): every shim rank of one daemon."""
        for row in steps.ranks:
            self.saw_step(steps.round, row.step)
            metrics = self.update_rank(row.rank, node_id, row.step, row.loss, row.throughput)
            metrics.samples, metrics.step_time, metrics.last_step_at = row.samples, row.step_time, row.last_step_at
            metrics.pushed_at = metrics.updated_at
        self.changed()

    def saw_step(self, round_id: Any, step: Any) -> None:
        """Keep the first step of each round: the loss plot marks where rounds began."""
        if round_id is None or step is None:
            return
        first = self.round_first_step.get(int(round_id))
        if first is None or int(step) < first:
            self.round_first_step[int(round_id)] = int(step)

    def unfollowed(self, node_id: str) -> None:
        """This console no longer hears the node itself (scrolled off): its age comes from `status` again."""
        node = self.nodes.get(node_id)
        if node is not None:
            node.heard_at, node.connected = None, True

    def disconnected(self, node_id: str) -> None:
        if node_id in self.nodes:
            self.nodes[node_id].connected = False
            self.changed()

    # ---- derived -----------------------------------------------------------------------------------
    @property
    def paged(self) -> bool:
        """A large job: `status` is asked for a page, and only the daemons on screen are followed."""
        return self.nodes_total > PAGED_ABOVE

    def row_keys(self) -> list[str]:
        """The nodes table's keys, the same list until a node joins or a page fills rows: a paged job has one
        row per node in join order, a placeholder where its node is not fetched yet."""
        version = (self.layout, len(self.nodes), self.paged)
        if version != self.keys_cache[0]:
            keys = ([node_id or placeholder(i) for i, node_id in enumerate(self.joined)] if self.paged
                    else list(self.nodes))
            self.keys_cache = (version, keys)
        return self.keys_cache[1]

    def rank_cells(self) -> list[tuple[int, str]]:
        """(rank, node id) of every rank of the round, sorted: computed again only when the rank map changes."""
        if self.rank_cells_cache is None:
            self.rank_cells_cache = sorted((int(rank), str(entry.get("node_id"))) for entry in self.rank_map
                                           for rank in entry.get("ranks", []))
        return self.rank_cells_cache

    def heartbeat_age(self, node: NodeView) -> float | None:
        return None if node.last_seen is None else max(0.0, self.clock() - node.last_seen)

    def node_liveness(self, node: NodeView) -> str:
        return liveness(self.heartbeat_age(node), node.connected, node.status)

    def short_names(self, width: int) -> dict[str, str]:
        """Every node's name in about `width` cells (tui/names.py), computed again only when a node joins."""
        cached = self.names.get(width)
        if cached is None or cached[0] != len(self.nodes):  # nodes are never removed: the count is a version
            cached = self.names[width] = (len(self.nodes), short_names(list(self.nodes), width))
        return cached[1]

    def short_name(self, node_id: str, width: int) -> str:
        return self.short_names(width).get(node_id) or short_names([node_id], width)[node_id]

    def checkpoint_age(self) -> float | None:
        """The age of the job's newest checkpoint (the least over its ranks), whichever node wrote it."""
        newest = self.newest_checkpoint
        at = newest.checkpoint_at if newest is not None else None
        return None if at is None else max(0.0, self.clock() - at)

    def recent_cause(self, node_id: str | None = None) -> RootCause | None:
        """The root cause (naming `node_id`, if given) while its round is the current or the one before, the round
        that replaced it: later the job has moved on."""
        cause = self.root_cause
        if cause is None or node_id not in (None, cause.failure.node) or cause.failure.round < self.job.round - 1:
            return None
        return cause

    def in_round(self, node: NodeView) -> bool:
        """Whether the node's workers train in the current round: only then are its step and rates live."""
        return bool(node.ranks) and node.role not in ("standby", "draining") and node.status not in ("lost", "left")

    def node_ranks(self, node_id: str) -> list[RankView]:
        found = self.ranks_by_node.get(node_id)
        return [found[r] for r in sorted(found)] if found else []

    def recoveries(self) -> list[dict[str, Any]]:
        """Recovery timelines, newest last: the latest `round_complete`/`first_step` of each round."""
        by_round: dict[int, dict[str, Any]] = {}
        for event in self.events:
            if event.get("kind") in ("round_complete", "first_step") and event.get("timeline"):
                by_round[int(event.get("round", 0))] = event
        return [by_round[r] for r in sorted(by_round)]
