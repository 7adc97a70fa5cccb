"""The membership authority: decides every round (members, sticky ranks, master), counts restarts by cause.

A plain object with `send` and `store` injected, driven by `receive` (one mesh message) and `tick` (time):
the same code runs inside the daemon that holds the coordinator role and in-process in tests.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from elasticd.coordinator import inbox
from elasticd.coordinator.alarms import Alarms
from elasticd.coordinator.assignments import node_part, shared_fields
from elasticd.coordinator.core import PendingRound, Send, SendAll
from elasticd.coordinator.goodput import GoodputLedger
from elasticd.coordinator.health import NodeHealth
from elasticd.coordinator.liveness import Liveness
from elasticd.coordinator.membership import MembershipStore, NodeRecord, Round, StoredJob, build_rank_map, sticky_order
from elasticd.coordinator.probes import FailureProbe
from elasticd.coordinator.registration import Registration
from elasticd.coordinator.relay_plan import RelayPlan
from elasticd.coordinator.relay_routes import RelayRoutes
from elasticd.coordinator.resize import Resizer
from elasticd.coordinator.round_progress import RoundTracker
from elasticd.coordinator.status import job_status
from elasticd.coordinator.stragglers import Stragglers
from elasticd.coordinator.tally import ACTIVE, NodeTally
from elasticd.coordinator.transitions import Transition, Transitions
from elasticd.job.config import JobConfig
from elasticd.job.events import EventLog, emit_log
from elasticd.wire.assignment import KillWorker, NodePart, RoundAssignment, with_part
from elasticd.wire.member_reports import Leave, RoundReport
from elasticd.wire.member_state import EventReport, Heartbeat
from elasticd.wire.names import (
    ENDED,
    RESTART_CAUSES,
    After,
    Cause,
    EventKind,
    JobState,
    MeshOp,
    NodeStatus,
    Role,
    StepRequest,
    TransitionKind,
)
from elasticd.wire.protocol import Envelope

log = logging.getLogger("elasticd")
SETTLE_S = 0.1  # batch simultaneous joins/losses into one round; no fixed last-call wait
# A round that lost a member is broken: its survivors stall for every ms of the window. The daemons that one cause
# ends at once (a job step's kill, an OOM sweep) close their connections within a few ms of each other.
BROKEN_SETTLE_S = 0.02


class Coordinator:
    """The job's membership authority. It keeps the job's own state (state, target, restarts, the round and the one
    pending), forms rounds and records events; the rest is its parts', each given the narrow view it needs:

    - `registration` (registration.py): nodes joining, their welcome, announcements, heartbeats;
    - `liveness` (liveness.py): members judged gone by a closed connection or by missed heartbeats;
    - `routes` (relay_routes.py): which relay each member of a large job sends through;
    - `probe` (probes.py): a worker's failure, charged only once every other member answered a probe;
    - `tracker` (round_progress.py): the round in place, from its stop barrier and `go` to its first step;
    - `transitions` (transitions.py): the graceful change in flight, whose ranks stop at one agreed step;
    - `resizer` (resize.py): rounds that keep their workers in place; `status` (status.py): the summary;
    - `goodput`, `stragglers`, `alarms`, `health` (their .py): where the time went, who slows the job, the
      operator's thresholds on both, and sick nodes and lemons out with spares in.
    """

    def __init__(self, cfg: JobConfig, store: MembershipStore, send: Send, events: EventLog,
                 on_event: Callable[[dict[str, Any]], None], clock: Callable[[], float] = time.time,
                 connected: Callable[[str], bool] = lambda _node_id: False,
                 backlog: Callable[[], bool] = lambda: False, send_all: SendAll | None = None) -> None:
        self.cfg, self.store, self.send = cfg, store, send
        self.send_all: SendAll = send_all or self.send_each
        self.events, self.on_event = events, on_event
        self.clock = clock  # injected so that scenario tests run on a fake clock
        self.backlog = backlog  # frames from members not yet read: liveness waits for them
        self.state, self.reason = JobState.waiting, f"waiting for {cfg.min_nodes} node(s) to register"
        self.target = cfg.max_nodes
        self.restarts: dict[Cause, int] = dict.fromkeys(RESTART_CAUSES, 0)
        self.round: Round | None = None
        self.pending: PendingRound | None = None  # the next round, once its settle window passes
        # The join timeout counts from the first wait on a registered node, and spares nodes that announced they
        # are warming up: a zygote importing torch on a loaded host is not an absent node.
        self.waiting_since: float | None = None
        self.told_waiting: set[str] = set()  # members that have this wait's notice (a `round` of null)
        self.used_ports: set[int] = set()
        self.join_seq = 0  # join order of nodes; persisted with etcd so a new coordinator numbers on
        self.ended_at = 0.0
        self.status_extra: Callable[[], dict[str, Any]] = dict  # --rdzv-backend etcd: epoch, etcd health
        self.goodput = GoodputLedger(clock())  # fed every event (_record)
        self.stragglers, self.alarms = Stragglers(self), Alarms(self, self.goodput)
        self.resizer = Resizer(cfg.job_id, self.emit)  # in-place rounds (elasticd/coordinator/resize.py)
        self.health = NodeHealth(self, self.resizer.warming)
        self.routes = RelayRoutes(self)
        self.tracker = RoundTracker(self)
        self.liveness = Liveness(self, connected, self.routes.relay_silent, lambda n: self.probe.awaits(n))
        self.probe = FailureProbe(self, self.liveness.lose_closed, self.health.failure_charged)
        self.transitions = Transitions(self)
        self.registration = Registration(self, self.routes, self.tracker.resend_missed)
        self.handlers = inbox.handlers(self)

    # ---- messages -----------------------------------------------------------------------------
    def send_each(self, node_ids: list[str], op: MeshOp, body: dict[str, Any]) -> None:
        """`send_all` without a mesh that can encode once (tests): a copy of the body to each."""
        for node_id in node_ids:
            self.send(node_id, op, dict(body))

    def receive(self, sender: str, env: Envelope, now: float) -> None:
        """One message from a member (or this daemon's own node): coordinator/inbox.py says which part takes it."""
        inbox.receive(self.handlers, self.nodes, sender, env, now)

    # ---- events -------------------------------------------------------------------------------
    def emit(self, kind: EventKind, node: str = "", ts: float = 0.0, **fields: Any) -> dict[str, Any]:
        return self._record(kind, node or self.cfg.node_id, ts, **fields)

    def adopt(self, event: EventReport, node: str) -> None:
        """A member's event enters the job log with the job's sequence number, as the sending node's."""
        self._record(event.kind or EventKind.unknown, node, event.ts, **event.fields)

    def _record(self, kind: str, node: str, ts: float, **fields: Any) -> dict[str, Any]:
        event = self.events.append(kind, node, ts or self.clock(), **fields)
        emit_log(event)
        self.goodput.observe(event)
        self.on_event(event)
        return event

    # ---- reading: the parts' state, as the verbs, the daemon and `status` see it ---------------
    @property
    def nodes(self) -> dict[str, NodeRecord]:
        return self.store.nodes()

    def alive(self) -> list[NodeRecord]:
        return [n for n in self.nodes.values() if n.status == NodeStatus.alive]

    @property
    def tally(self) -> NodeTally:
        return self.registration.tally

    @property
    def relays(self) -> RelayPlan:
        return self.routes.plan

    @property
    def transition(self) -> Transition | None:
        """The graceful change in flight, if any."""
        return self.transitions.current

    def status(self, now: float, offset: int = 0, limit: int | None = None) -> dict[str, Any]:
        return job_status(self, now, offset, limit)

    # ---- steering: what the verbs and the daemon ask of the parts ------------------------------
    def begin_transition(self, kind: TransitionKind, leaving: list[str], final_role: Role, then: After,
                         detail: str, cause: Cause = Cause.membership, detected: float = 0.0,
                         hold: float = 0.0) -> str:
        return self.transitions.begin(kind, leaving, final_role, then, detail, cause, detected, hold)

    def fold_departing(self, node_id: str, reason: str) -> None:
        self.transitions.fold_departing(node_id, reason)

    def stop_gracefully(self, why: str) -> None:
        self.transitions.stop_gracefully(why)

    def ask_step(self, op_id: str, request: StepRequest) -> None:
        self.transitions.ask_step(op_id, request)

    def stored(self) -> StoredJob:
        """What a coordinator taking over restores besides nodes and rounds (etcd's `state/job`)."""
        return StoredJob(self.target, {str(k): n for k, n in self.restarts.items()}, sorted(self.used_ports),
                         self.state, self.reason, self.join_seq, self.cfg.node_id)

    def restore(self, job: StoredJob | None, last_round: Round | None) -> None:
        """A takeover: the counters and the last round as the coordinator before us stored them."""
        if job is not None:
            self.target, self.used_ports, self.join_seq = job.target, set(job.used_ports), job.join_seq
            self.restarts = {Cause(k): n for k, n in job.restarts.items()}
            self.state, self.reason = job.state, job.reason
        self.round = last_round

    def aim_at(self, nodes: int) -> None:
        """The node count the job aims at from now on (`scale`, `drain`): standbys fill up to it, no more."""
        self.target = nodes

    def kill_worker(self, node_id: str, rank: int) -> None:
        """A failure drill: that node SIGKILLs the rank's worker, and the job recovers as from any crash."""
        self.send(node_id, MeshOp.kill_worker, KillWorker(rank).encode())

    def heartbeat(self, node_id: str, beat: Heartbeat, now: float) -> bool:
        return self.registration.heartbeat(node_id, beat, now)

    def replace_relay(self, node_id: str, now: float) -> None:
        self.routes.replace_relay(node_id, now)

    # ---- members going ------------------------------------------------------------------------
    def leave(self, node_id: str, leave: Leave, now: float) -> None:
        """A node says it goes (its daemon got SIGTERM): with `graceful`, its ranks first stop at one agreed step."""
        reason = leave.reason or f"node {node_id} left"
        if leave.graceful and self.transitions.drain_departing(node_id, reason):
            return
        self.remove(node_id, NodeStatus.left, reason, now)
        self.send(node_id, MeshOp.left, {"reason": reason})

    def connection_lost(self, node_id: str, now: float) -> None:
        """The mesh saw this member's connection close: liveness.py judges whether, and when, it is lost."""
        self.liveness.connection_lost(node_id, now)

    def remove(self, node_id: str, status: NodeStatus, detail: str, now: float, reform: bool = True) -> None:
        """The node is gone; `reform` starts a round without it (a caller that starts one itself says False)."""
        self.liveness.forget(node_id)
        node = self.nodes.get(node_id)
        if node is None or node.status != NodeStatus.alive:
            return
        node.status = status
        self.emit(EventKind.node_lost if status == NodeStatus.lost else EventKind.node_left, node_id, reason=detail)
        self.routes.replace_relay(node_id, now)
        if reform and self.round and self.round.has(node_id):
            self.probe.round_replaced(detail)
            self.schedule(Cause.membership, detail, now, due=now + BROKEN_SETTLE_S)
        self.tracker.node_gone(node_id)

    def node_done(self, node_id: str, done: RoundReport, now: float) -> None:
        rnd = self.round
        if rnd is not None and self.tracker.node_done(node_id, done.round) and self.pending is None \
                and self.transition is None:
            self.end(JobState.succeeded, f"every worker of the final round finished (world {rnd.world_size})", now)

    def end(self, state: JobState, reason: str, now: float) -> None:
        if self.state in ENDED:
            return
        self.state, self.reason, self.ended_at = state, reason, now
        self.pending = self.transitions.current = None
        cause = self.probe.root_cause() if state == JobState.failed else None
        why: dict[str, Any] = {"root_cause": cause, "consequences": [f.body() for f in self.probe.consequences]} \
            if cause else {}
        self.emit(EventKind.job_end, state=state, reason=reason, **why)
        self.emit(EventKind.goodput, **self.goodput.state(), report=self.goodput.report(now).encode())
        self.send_all([n.node_id for n in self.alive()], MeshOp.job_end, {"state": state, "reason": reason, **why})

    # ---- time ---------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Everything time decides: lost nodes, a settled round, a finished transition, expired queries."""
        if self.state in ENDED:
            return
        self.liveness.credit_stall(now)
        if not self.backlog():  # heartbeats may be waiting in the queue: judge only once it is drained
            self.liveness.check_liveness(now)
        self.start_pending_round(now)
        self.tracker.force_if_overdue(now)
        if self.state == JobState.waiting and self.waiting_since is not None and self.pending is None \
                and now - self.waiting_since > self.cfg.join_timeout_s and not self.registration.coming(now):
            self.end(JobState.failed, f"join timeout: {self.reason} for {self.cfg.join_timeout_s:.0f}s", now)
        self.transitions.ask_when_due(now)
        self.transitions.finish_if_ready(now)
        if self.resizer.expired(now):
            self.restart_after_resize(now)
        self.transitions.resolve_expired(now)
        for part in (self.stragglers, self.alarms, self.health):
            part.check(now)

    # ---- rounds -------------------------------------------------------------------------------
    def schedule(self, cause: Cause, detail: str, detected_at: float, due: float | None = None) -> None:
        """Queue a new round after the settle window (or at `due`); the first cause queued keeps its time."""
        if self.state in ENDED:
            return
        if self.pending is None:
            self.pending = PendingRound(cause, detail, detected_at, 0.0)
        self.pending.due = self.clock() + SETTLE_S if due is None else due

    def start_pending_round(self, now: float) -> None:
        pending = self.pending
        if pending is None or now < pending.due:
            return
        graceful = pending.cause in (Cause.membership, Cause.operator) and not self.round_lost_a_member()
        if self.transition is not None and graceful:
            return  # a graceful stop is in flight; its end starts the round (a lost member abandons it)
        if self.registration.awaiting_announced(self.tally.count(ACTIVE), now) \
                or (self.round is None and self.resizer.store_pending) \
                or (graceful and (self.resizer.settling(now)
                                  or self.resizer.warming_up({n.node_id for n in self.alive()}, now))):
            return
        self.pending = None
        if not self.transitions.reform_first(pending):
            self.start_round(pending.cause, pending.detail, pending.detected_at, now)

    def round_lost_a_member(self) -> bool:  # a broken round: it waits for no warm-up, no generation in flight
        return self.round is not None and any(self.nodes[n].status != NodeStatus.alive for n in self.round.node_ids())

    def candidates(self) -> list[NodeRecord]:
        """Active nodes up to the target, promoting standbys when the job is below it."""
        alive = sorted(self.alive(), key=lambda n: n.joined_seq)
        order = sticky_order(self.round.node_ids() if self.round else [],
                             [n for n in alive if n.role == Role.active])
        cap = min(self.target, self.cfg.max_nodes)
        # A spare fills in before a node that just left the round (drained) comes back: stable sort, leavers last.
        for node in sorted(alive, key=lambda n: self.round is not None and self.round.has(n.node_id)):
            if len(order) >= cap:
                break
            if node.role == Role.standby:
                node.role = Role.active
                order.append(node.node_id)
                self.emit(EventKind.node_role, node.node_id, role=Role.active)
        for node_id in order[cap:]:
            self.nodes[node_id].role = Role.standby
            self.emit(EventKind.node_role, node_id, role=Role.standby)
        return [self.nodes[n] for n in order[:cap]]

    def start_round(self, cause: Cause, detail: str, detected: float, now: float) -> None:
        self.transitions.round_starts()
        members = self.candidates()
        previous = self.round
        if len(members) < self.cfg.min_nodes:
            self.wait_for_nodes(len(members), now)
            return
        if previous is not None and self.state == JobState.running:
            self.count_restart(cause, previous)
        first = sorted(members, key=lambda n: (n.node_id != self.cfg.node_id, n.joined_seq))  # ours is rank 0
        entries, world = build_rank_map([m.node_id for m in (first if previous is None else members)], self.nodes)
        master = self.nodes[entries[0].node_id]
        port = next((p for p in master.ports if p not in self.used_ports), 0)
        self.used_ports.add(port)
        round_id = (previous.round_id + 1) if previous else 1
        rnd = Round(round_id, entries, world, master.host, port, cause if previous else Cause.start, detail, now,
                    timeline={"detect": detected, "rendezvous": now})
        in_place = self.state == JobState.running and self.resizer.begin(previous, members, round_id, detected, now)
        self.round, self.state, self.reason = rnd, JobState.running, ""
        self.tracker.begin(previous)
        self.store.put_round(rnd)
        self.emit(EventKind.round_started, round=round_id, world_size=world, cause=rnd.cause, detail=detail,
                  rank_map={e.node_id: e.ranks for e in entries}, in_place=in_place)
        shared = self.round_shared().encode()
        for node in self.alive():
            part = self.node_part(node)
            self.resizer.hot_spares(node.node_id, part["prewarm"], now)
            self.send(node.node_id, MeshOp.round, with_part(shared, part))
        self.tracker.release_barrier(None)

    def wait_for_nodes(self, members: int, now: float) -> None:
        """Too few active nodes for --nnodes min: the job waits (and fails past the join timeout)."""
        if self.state != JobState.waiting or self.waiting_since is None:
            self.waiting_since, self.told_waiting = now, set()
        self.state = JobState.waiting
        self.reason = (f"waiting for {self.cfg.min_nodes - members} more node(s): "
                       f"{members} active, --nnodes min is {self.cfg.min_nodes}")
        self.emit(EventKind.waiting, reason=self.reason, join_timeout_s=self.cfg.join_timeout_s)
        # Each member hears once that the job waits (a newcomer when it comes): telling all of them again at
        # every registration made N daemons that start one by one cost O(N²) frames. `status` has the count.
        untold = [n.node_id for n in self.alive() if n.node_id not in self.told_waiting]
        self.told_waiting.update(untold)
        self.send_all(untold, MeshOp.round, {"round": None, "state": JobState.waiting, "reason": self.reason})

    def count_restart(self, cause: Cause, previous: Round) -> None:
        """A round replaces a running one: the job's restarts by cause, and each restarted node's."""
        self.restarts[cause] += 1
        for node_id in previous.node_ids():  # these nodes' workers are restarted by this round
            node = self.nodes.get(node_id)
            if node is not None and node.status == NodeStatus.alive:  # a new dict: the store sees the change
                node.restarts = {**node.restarts, cause: node.restarts[cause] + 1}

    def assignment(self, node_id: str) -> RoundAssignment:
        """This node's part in the current round (a round sent again, to one node)."""
        return dataclasses.replace(self.round_shared(), **self.node_part(self.nodes[node_id]))

    def round_shared(self) -> RoundAssignment:
        assert self.round is not None
        return shared_fields(self.round, self.nodes, self.restarts[Cause.failure], self.cfg.max_restarts,
                             self.resizer.fields(self.round))

    def node_part(self, node: NodeRecord) -> NodePart:
        assert self.round is not None
        return node_part(self.round, node, self.resizer.hot_spare)

    def first_step(self, node_id: str, round_id: int, at: float, step: int | None) -> None:
        if self.tracker.first_step(node_id, round_id, at, step):
            self.emit(EventKind.goodput, **self.goodput.state())  # what a coordinator taking over resumes from
            self.transitions.stop_after_first_step()

    # ---- in-place rounds ----------------------------------------------------------------------
    def resize_failed(self, round_id: int, reason: str, now: float) -> None:
        if self.resizer.failed(round_id, reason):
            self.restart_after_resize(now)

    def restart_after_resize(self, now: float) -> None:
        """An in-place round failed: today's restart path, at once (its ranks are waiting, not training)."""
        rnd = self.round
        if rnd is None or self.state != JobState.running:
            return
        self.transitions.reformed = True  # no step to agree: the ranks are out of any group
        self.schedule(rnd.cause, f"in-place resize failed: {self.resizer.fall_back}", now, due=now)

    def rank_map(self, order: list[str]) -> tuple[dict[str, list[int]], int]:
        """Each node's global ranks in a round of `order`, and its world size: a verb's plan (commands/port.py)."""
        entries, world = build_rank_map(order, self.nodes)
        return {e.node_id: e.ranks for e in entries}, world
