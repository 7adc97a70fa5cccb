"""Nodes joining the job: registration and its welcome, announcements of daemons warming up, and heartbeats."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from elasticd.coordinator.assignments import expected_world
from elasticd.coordinator.core import CoordinatorCore, PendingRound
from elasticd.coordinator.membership import MembershipStore, NodeRecord
from elasticd.coordinator.relay_routes import RelayRoutes
from elasticd.coordinator.resize import Resizer
from elasticd.coordinator.tally import ACTIVE, NodeTally
from elasticd.job.events import EventLog
from elasticd.wire.assignment import RoundAssignment, Welcome
from elasticd.wire.member_state import Heartbeat, Register
from elasticd.wire.names import ENDED, Cause, EventKind, JobState, MeshOp, NodeStatus, Role
from elasticd.wire.protocol import ErrorCode, ProtocolError

FIRST_ROUND_WAIT_S = 15.0  # the first round waits at most this long for nodes that announced themselves
ResendMissed = Callable[[str, Heartbeat, float], None]  # RoundTracker.resend_missed: (sender, heartbeat, now)


class RegistrationCore(CoordinatorCore, Protocol):
    """What registration needs of the coordinator besides the core: the store, the job's size and join order,
    and the round a newcomer may start."""

    store: MembershipStore
    events: EventLog
    pending: PendingRound | None
    target: int
    join_seq: int  # join order of nodes; persisted with etcd so a new coordinator numbers on
    told_waiting: set[str]
    resizer: Resizer

    def schedule(self, cause: Cause, detail: str, detected_at: float, due: float | None = None) -> None: ...

    def assignment(self, node_id: str) -> RoundAssignment: ...


class Registration:
    """Admits nodes: a registration gets its role (active up to the target, else standby) and a welcome, a repeated
    one the same answer again; heartbeats keep a member's record current and its route and round in step."""

    def __init__(self, core: RegistrationCore, routes: RelayRoutes, resend_missed: ResendMissed) -> None:
        self.core = core
        self.routes = routes
        self.resend_missed = resend_missed
        self.announced: dict[str, float] = {}  # node id -> when it said it is warming up to join
        self._tally = NodeTally()

    @property
    def tally(self) -> NodeTally:
        """Node counts by group, kept as records change (a registration storm would otherwise be O(N²))."""
        return self._tally.rebuild(self.core.nodes)

    def on_register(self, sender: str, reg: Register, now: float) -> None:
        core = self.core
        node = core.nodes.get(sender)
        if node is not None and node.status == NodeStatus.alive and node.instance == reg.instance:
            self.catch_up(node, now)  # a repeat (our welcome was lost): the same answer, no new join, no round
            return
        welcome = self.register(sender, reg, now)
        core.send(sender, MeshOp.welcome, welcome.encode())
        node = core.nodes.get(sender)
        if welcome.ok and node and core.round and core.pending is None and node.role != Role.active:
            core.send(sender, MeshOp.round, {"round": None, "state": node.role,
                                             "reason": f"node is {node.role}; the job is at its target size"})

    def catch_up(self, node: NodeRecord, now: float) -> None:
        """A welcomed daemon that asks again missed what followed: its welcome, and its part of the round."""
        core = self.core
        node.last_seen = now
        core.send(node.node_id, MeshOp.welcome, self.welcome(node).encode())
        rnd = core.round
        if rnd is not None and core.state == JobState.running and rnd.has(node.node_id):
            core.send(node.node_id, MeshOp.round, core.assignment(node.node_id).encode())
            if rnd.timeline.get("go"):
                core.send(node.node_id, MeshOp.go, {"round": rnd.round_id})

    def welcome(self, node: NodeRecord) -> Welcome:
        """What a member needs to start: its role, the round, and where the job's events are published."""
        core = self.core
        ours = core.nodes.get(core.cfg.node_id)
        rnd = core.round
        prewarm = node.role == Role.active and core.resizer.prewarm(node, rnd, core.clock())
        expected = expected_world(rnd, node) if prewarm and rnd is not None else 0
        store = core.resizer.store if prewarm else ""  # where its pre-started workers read the state's size
        return Welcome(True, node.role, rnd.round_id if rnd else 0, ours.pub if ours else "", prewarm, expected,
                       self.routes.via_endpoint(node), store=store, prefix=core.resizer.job_prefix if store else "",
                       job_store_tunnel=core.resizer.tunnel if store else "")

    def register(self, node_id: str, reg: Register, now: float) -> Welcome:
        core = self.core
        old = core.nodes.get(node_id)
        if old and old.status == NodeStatus.alive and old.instance != reg.instance:
            return Welcome.refusal(ProtocolError(
                ErrorCode.DUPLICATE_NODE, f"node id '{node_id}' is already in job '{core.cfg.job_id}' (host "
                f"{old.host}); give each node a unique --node-id"))
        if core.state in ENDED:
            return Welcome(False, reason=f"job '{core.cfg.job_id}' has ended ({core.state})")
        core.join_seq += 1
        self.announced.pop(node_id, None)
        core.told_waiting.discard(node_id)  # a new instance of it has heard nothing yet
        active = self.tally.count(ACTIVE) - (old is not None and old.group() == ACTIVE)
        role = (Role.cordoned if old and old.role == Role.cordoned
                else Role.active if active < core.target else Role.standby)
        node = NodeRecord(node_id, reg.host, reg.nproc, reg.instance, core.join_seq, node_rank=reg.node_rank,
                          role=role, last_seen=now, ports=list(reg.ports), control=reg.control, pub=reg.pub,
                          store_tunnel=reg.store_tunnel, relay_endpoint=reg.relay)
        self.routes.place(node)
        core.store.put_node(node)
        self._tally.add(node, replaces=old)
        extra: dict[str, Any] = {"via": node.via} if node.via else {}
        if reg.scheduler is not None:  # the SLURM step it runs in: its job, and how often requeued
            extra["scheduler"] = reg.scheduler.encode()
        core.emit(EventKind.node_joined, node_id, host=node.host, nproc=node.nproc, role=role, **extra)
        if role == Role.active:
            core.schedule(Cause.membership, f"node {node_id} joined", now)
        return self.welcome(node)

    def announce(self, node_id: str, now: float) -> None:
        """A daemon started and is warming up (its zygote imports torch); it registers when ready."""
        nodes = self.core.nodes
        if node_id not in nodes or nodes[node_id].status != NodeStatus.alive:
            self.announced[node_id] = now

    def coming(self, now: float) -> list[str]:
        """Nodes that announced themselves lately and have not registered: warming up, not absent."""
        nodes = self.core.nodes
        return [n for n, at in self.announced.items() if now - at < FIRST_ROUND_WAIT_S and n not in nodes]

    def awaiting_announced(self, members: int, now: float) -> bool:
        """Hold the first round for nodes that announced themselves."""
        coming = self.coming(now)
        return self.core.round is None and bool(coming) and members + len(coming) <= self.core.cfg.max_nodes

    def on_heartbeat(self, sender: str, beat: Heartbeat, now: float) -> None:
        core = self.core
        if not self.heartbeat(sender, beat, now):
            core.send(sender, MeshOp.unknown, {})
            return
        rnd = core.round
        core.send(sender, MeshOp.hb, {"seq": core.events.seq, "round": rnd.round_id if rnd else 0,
                                      "beat": beat.beat})  # what that heartbeat carried is held now
        if self.routes.plan.size and beat.via is not None:
            self.routes.check_route(core.nodes[sender], beat, now)
        self.resend_missed(sender, beat, now)

    def heartbeat(self, node_id: str, beat: Heartbeat, now: float) -> bool:
        node = self.core.nodes.get(node_id)
        if node is None or node.status != NodeStatus.alive or node.instance != beat.instance:
            return False  # unknown to us (lost, or a coordinator restart): the node must register again
        node.last_seen = now
        # Absent fields did not change since a heartbeat we answered (elasticd/member/beats.py): keep the last values.
        if beat.ports is not None:
            node.ports = beat.ports
        if beat.workers is not None:
            node.workers = beat.workers
        if beat.metrics is not None:
            node.metrics = beat.metrics
        return True
