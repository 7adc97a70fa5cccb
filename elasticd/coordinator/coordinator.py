"""The membership authority: decides every round (members, sticky ranks, master), counts restarts by cause.

A plain object with `send` and `store` injected, driven by `receive` (one mesh message) and `tick` (time):
the same code runs inside the daemon that holds the coordinator role and in-process in tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elasticd.coordinator.membership import MembershipStore, NodeRecord, Round, build_rank_map, sticky_order
from elasticd.coordinator.relay_plan import RelayPlan
from elasticd.coordinator.resize import Resizer
from elasticd.coordinator.step_agreement import WORKER_OPS, StepAgreement, StepQuery
from elasticd.coordinator.tally import ACTIVE, NodeTally
from elasticd.coordinator.transitions import DRAIN_TIMEOUT_S, SIGNAL_WINDOW_S, Transition
from elasticd.job.config import JobConfig, stop_barrier_s
from elasticd.job.events import EventLog, emit_log
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
from elasticd.wire.protocol import Envelope, new_id

log = logging.getLogger("elasticd")
Send = Callable[[str, MeshOp, dict[str, Any]], None]  # (node_id, op, body)
SendAll = Callable[[list[str], MeshOp, dict[str, Any]], None]  # one message to many: the mesh encodes it once
Handler = Callable[[str, dict[str, Any], float], None]  # (sender, body, now)
_NUMBERED = ("seq", "ts", "kind", "node")  # an adopted event's fields the job log sets itself
SETTLE_S = 0.1  # batch simultaneous joins/losses into one round; no fixed last-call wait
STALL_S = 1.0  # a tick this late means the coordinator's own loop stood still
FIRST_ROUND_WAIT_S = 15.0  # the first round waits at most this long for nodes that announced themselves
# A member's connection that closes and is back within this long (a reset link; the DEALER reconnects in
# ~100 ms) costs nothing; one still closed then is a dead daemon. docs/architecture.md, "Noticing a dead node".
RECONNECT_GRACE_S = 0.5


@dataclass
class PendingRound:
    """A round to start once the settle window passes; the first cause queued is the root cause."""

    cause: Cause
    detail: str
    detected_at: float
    due: float


@dataclass
class Suspect:
    """A reported worker failure, charged only once every other member answers a probe.

    When a node dies, its peers' workers fail too; that is a membership change, not a charged failure.
    """

    node_id: str
    report: dict[str, Any]
    awaiting: set[str] = field(default_factory=set)


class Coordinator:
    def __init__(self, cfg: JobConfig, store: MembershipStore, send: Send, events: EventLog,
                 on_event: Callable[[dict[str, Any]], None], clock: Callable[[], float] = time.time,
                 connected: Callable[[str], bool] = lambda _node_id: False,
                 backlog: Callable[[], bool] = lambda: False, send_all: SendAll | None = None) -> None:
        self.cfg = cfg
        self.send_all = send_all or self.send_each
        self.backlog = backlog  # frames from members not yet read: liveness waits for them
        self.last_tick = 0.0
        self.liveness_due = 0.0  # no member can have been silent past the limit before this (check_liveness)
        self.clock = clock  # injected so that scenario tests run on a fake clock
        self.store = store
        self.send = send
        self.events = events
        self.on_event = on_event
        self.state = JobState.waiting
        self.reason = f"waiting for {cfg.min_nodes} node(s) to register"
        self.target = cfg.max_nodes
        self.restarts: dict[Cause, int] = dict.fromkeys(RESTART_CAUSES, 0)
        self.round: Round | None = None
        self.pending: PendingRound | None = None
        self.waiting_since = clock()
        self.told_waiting: set[str] = set()  # members that have this wait's notice (a `round` of null)
        self.done_nodes: set[str] = set()
        self.suspect: Suspect | None = None
        # Whether a node's daemon has a live mesh connection now (the mesh asks its ROUTER); with no mesh to
        # ask, a connection reported closed stays closed.
        self.connected = connected
        self.closed: dict[str, float] = {}  # node id -> when the mesh saw its connection close
        self.transition: Transition | None = None
        self.stop_after_round = ""  # why the job stops once the round in place that follows takes its first step
        self.agreement = StepAgreement(self.send_all)
        self.resizer = Resizer(cfg.job_id, self.emit)  # in-place rounds (elasticd/coordinator/resize.py)
        self.reformed = False  # the workers already stopped gracefully for the pending round
        self.announced: dict[str, float] = {}  # node id -> when it said it is warming up to join
        # Nodes whose workers of the previous round still run: the new round's workers start when this
        # empties (every old rank gone), so no global rank is ever alive in two worlds at once.
        self.stop_barrier: set[str] = set()
        self.used_ports: set[int] = set()
        self.stopped_at: dict[str, float] = {}  # this round's members: when their old workers were gone
        self.spawned_at: dict[str, float] = {}  # ... and when their new ones were up
        self.resent: dict[str, float] = {}  # ... and when one last got its `round` or `go` again
        self.reported: set[tuple[str, str]] = set()  # (node, stopped|spawned) of this round already heard
        self.join_seq = 0  # join order of nodes; persisted with etcd so a new coordinator numbers on
        self._tally = NodeTally()
        self.relays = RelayPlan(cfg.relay_size)  # in a large job: which members send through which (relay_plan.py)
        self.told_route: dict[str, float] = {}  # member -> when it was last sent `relay` for a route it lacks
        self.ended_at = 0.0
        self.status_extra: Callable[[], dict[str, Any]] = dict  # --rdzv-backend etcd: epoch, etcd health
        self.handlers: dict[str, Handler] = {
            MeshOp.register: self.on_register,
            MeshOp.announce: lambda sender, _body, now: self.announce(sender, now),
            MeshOp.hb: self.on_heartbeat,
            MeshOp.leave: self.leave,
            MeshOp.worker_failed: self.worker_failed,
            MeshOp.node_done: self.node_done,
            MeshOp.node_drained: lambda sender, _body, now: self.node_drained(sender, now),
            MeshOp.round_progress: lambda sender, body, _now: self.round_progress(sender, body),
            MeshOp.first_step: lambda sender, body, _now: self.first_step(sender, int(body["round"]),
                                                                          float(body["at"])),
            MeshOp.step_report: self.on_step_report,
            MeshOp.pong: lambda sender, _body, now: self.pong(sender, now),
            MeshOp.event: lambda sender, body, _now: self.adopt(body, sender),
            MeshOp.warm: lambda sender, _body, _now: self.resizer.warm(sender),
            MeshOp.resize_failed: lambda _sender, body, now: self.resize_failed(int(body["round"]),
                                                                                str(body.get("reason", "")), now),
        }

    # ---- messages -----------------------------------------------------------------------------
    def send_each(self, node_ids: list[str], op: MeshOp, body: dict[str, Any]) -> None:
        """`send_all` without a mesh that can encode once (tests): a copy of the body to each."""
        for node_id in node_ids:
            self.send(node_id, op, dict(body))

    def receive(self, sender: str, env: Envelope, now: float) -> None:
        """One message from a member (or this daemon's own node), dispatched by op."""
        handler = self.handlers.get(env.op)
        if handler is None:
            log.warning("mesh: unknown op %r from %s dropped", env.op, sender)
            return
        node = self.nodes.get(sender)
        if node is not None and node.status == NodeStatus.alive and env.op not in (MeshOp.register, MeshOp.announce):
            node.last_seen = max(node.last_seen, now)  # any frame is a sign of life, not only a heartbeat
        try:
            handler(sender, env.body, now)
        except Exception as exc:  # one frame, however odd, must never end the coordinator's mesh loop
            log.warning("mesh: malformed %r from %s dropped: %r", env.op, sender, exc)

    # ---- events -------------------------------------------------------------------------------
    def emit(self, kind: EventKind, node: str = "", ts: float = 0.0, **fields: Any) -> dict[str, Any]:
        return self._record(kind, node or self.cfg.node_id, ts, **fields)

    def adopt(self, event: dict[str, Any], node: str = "") -> None:
        """A member's event enters the job log with the job's sequence number (`node`: the sender, if it says)."""
        fields = {k: v for k, v in event.items() if k not in _NUMBERED}
        ts = event.get("ts")
        self._record(str(event.get("kind") or EventKind.unknown), node or str(event.get("node", "?")),
                     float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else 0.0, **fields)

    def _record(self, kind: str, node: str, ts: float, **fields: Any) -> dict[str, Any]:
        event = self.events.append(kind, node, ts or self.clock(), **fields)
        emit_log(event)
        self.on_event(event)
        return event

    # ---- membership ----------------------------------------------------------------------------
    @property
    def nodes(self) -> dict[str, NodeRecord]:
        return self.store.nodes()

    def alive(self) -> list[NodeRecord]:
        return [n for n in self.nodes.values() if n.status == NodeStatus.alive]

    @property
    def tally(self) -> NodeTally:
        """Node counts by group, kept as records change (a registration storm would otherwise be O(N²))."""
        return self._tally.rebuild(self.nodes)

    def on_register(self, sender: str, body: dict[str, Any], now: float) -> None:
        node = self.nodes.get(sender)
        if node is not None and node.status == NodeStatus.alive and node.instance == body.get("instance"):
            self.catch_up(node, now)  # a repeat (our welcome was lost): the same answer, no new join, no round
            return
        welcome = self.register({**body, "node_id": sender}, now)
        self.send(sender, MeshOp.welcome, welcome)
        node = self.nodes.get(sender)
        if welcome["ok"] and node and self.round and self.pending is None and node.role != Role.active:
            self.send(sender, MeshOp.round, {"round": None, "state": node.role,
                                             "reason": f"node is {node.role}; the job is at its target size"})

    def catch_up(self, node: NodeRecord, now: float) -> None:
        """A welcomed daemon that asks again missed what followed: its welcome, and its part of the round."""
        node.last_seen = now
        self.send(node.node_id, MeshOp.welcome, self.welcome(node))
        rnd = self.round
        if rnd is not None and self.state == JobState.running and rnd.has(node.node_id):
            self.send(node.node_id, MeshOp.round, self.assignment(node.node_id))
            if rnd.timeline.get("go"):
                self.send(node.node_id, MeshOp.go, {"round": rnd.round_id})

    def welcome(self, node: NodeRecord) -> dict[str, Any]:
        """What a member needs to start: its role, the round, and where the job's events are published."""
        ours = self.nodes.get(self.cfg.node_id)
        prewarm = node.role == Role.active and self.resizer.prewarm(node, self.round, self.clock())
        via = self.via_endpoint(node)
        return {"ok": True, "role": node.role, "round": self.round.round_id if self.round else 0,
                "events_pub": ours.pub if ours else "", **({"prewarm": True} if prewarm else {}),
                **({"via": via} if via else {})}

    def via_endpoint(self, node: NodeRecord) -> str:
        """Where the member sends through: its relay's endpoint, or "" (the coordinator itself)."""
        relay = self.nodes.get(node.via) if node.via else None
        return relay.relay_endpoint if relay is not None and relay.status == NodeStatus.alive else ""

    def register(self, body: dict[str, Any], now: float) -> dict[str, Any]:
        node_id, instance = body["node_id"], body["instance"]
        old = self.nodes.get(node_id)
        if old and old.status == NodeStatus.alive and old.instance != instance:
            return {"ok": False, "reason": f"node id '{node_id}' is already in job '{self.cfg.job_id}' "
                    f"(host {old.host}); give each node a unique --node-id"}
        if self.state in ENDED:
            return {"ok": False, "reason": f"job '{self.cfg.job_id}' has ended ({self.state})"}
        self.join_seq += 1
        self.announced.pop(node_id, None)
        self.told_waiting.discard(node_id)  # a new instance of it has heard nothing yet
        active = self.tally.count(ACTIVE) - (old is not None and old.group() == ACTIVE)
        role = (Role.cordoned if old and old.role == Role.cordoned
                else Role.active if active < self.target else Role.standby)
        node = NodeRecord(node_id, body["host"], int(body["nproc"]), instance, self.join_seq,
                          node_rank=int(body.get("node_rank", -1)), role=role,
                          last_seen=now, ports=list(body.get("ports", [])), control=body.get("control", ""),
                          pub=body.get("pub", ""), store_tunnel=body.get("store_tunnel", ""),
                          relay_endpoint=str(body.get("relay", "")))
        if node_id != self.cfg.node_id:  # our own node is in process: no link to relay
            node.via = self.relays.place(node_id, bool(node.relay_endpoint))
        self.store.put_node(node)
        self._tally.add(node, replaces=old)
        relayed: dict[str, Any] = {"via": node.via} if node.via else {}
        self.emit(EventKind.node_joined, node_id, host=node.host, nproc=node.nproc, role=role, **relayed)
        if role == Role.active:
            self.schedule(Cause.membership, f"node {node_id} joined", now)
        return self.welcome(node)

    def announce(self, node_id: str, now: float) -> None:
        """A daemon started and is warming up (its zygote imports torch); it registers when ready."""
        if node_id not in self.nodes or self.nodes[node_id].status != NodeStatus.alive:
            self.announced[node_id] = now

    def awaiting_announced(self, members: int, now: float) -> bool:
        """Hold the first round for nodes that announced themselves: they are warming up, not absent."""
        coming = [n for n, at in self.announced.items() if now - at < FIRST_ROUND_WAIT_S and n not in self.nodes]
        return self.round is None and bool(coming) and members + len(coming) <= self.cfg.max_nodes

    def on_heartbeat(self, sender: str, body: dict[str, Any], now: float) -> None:
        if not self.heartbeat(sender, body, now):
            self.send(sender, MeshOp.unknown, {})
            return
        rnd = self.round
        self.send(sender, MeshOp.hb, {"seq": self.events.seq, "round": rnd.round_id if rnd else 0,
                                      "beat": body.get("beat")})  # what that heartbeat carried is held now
        if self.relays.size and "via" in body:
            self.check_route(self.nodes[sender], body, now)
        if rnd is None or self.state != JobState.running or not rnd.has(sender):
            return
        # A heartbeat that crossed our `round` or `go` on the way, or one from a member too busy to have read
        # it yet, is no loss: resend only a heartbeat interval after the last sending, once per interval.
        if now - self.resent.get(sender, rnd.started_at) <= self.cfg.heartbeat_s:
            return
        stop_unheard = sender in self.stop_barrier and now - rnd.started_at > self.cfg.lost_after_s
        if int(body.get("assigned", rnd.round_id)) < rnd.round_id or stop_unheard:
            self.resent[sender] = now  # its `round` was lost on the way, or its `stopped` on the way back
            self.send(sender, MeshOp.round, self.assignment(sender))
        elif rnd.timeline.get("go") and sender not in self.spawned_at and body.get("round") == rnd.round_id \
                and now - rnd.timeline["go"] > self.cfg.heartbeat_s:  # ... or its `go`
            self.resent[sender] = now
            self.send(sender, MeshOp.go, {"round": rnd.round_id})

    def heartbeat(self, node_id: str, body: dict[str, Any], now: float) -> bool:
        node = self.nodes.get(node_id)
        if node is None or node.status != NodeStatus.alive or node.instance != body.get("instance"):
            return False  # unknown to us (lost, or a coordinator restart): the node must register again
        node.last_seen = now
        # Absent fields did not change since a heartbeat we answered (elasticd/member/beats.py): keep the last values.
        if "ports" in body:
            node.ports = list(body["ports"])
        if "workers" in body:
            node.workers = body["workers"]
        if "metrics" in body:
            node.metrics = body["metrics"]
        return True

    def check_route(self, node: NodeRecord, body: dict[str, Any], now: float) -> None:
        """The member sends where it was told (`relay` again, at most once a heartbeat interval, if not); one
        that could not reach its relay talks to us directly from now on."""
        want = self.via_endpoint(node)
        if want and body.get("via_failed") == want:
            log.warning("[%s] node %s could not reach its relay %s (%s); it talks to the coordinator directly",
                        self.cfg.node_id, node.node_id, node.via, want)
            self.relays.direct(node.node_id)
            node.via, want = "", ""
        if body.get("via") != want and now - self.told_route.get(node.node_id, 0.0) > self.cfg.heartbeat_s:
            self.told_route[node.node_id] = now
            self.send(node.node_id, MeshOp.relay, {"via": want})

    def leave(self, node_id: str, body: dict[str, Any], now: float) -> None:
        """A node says it goes (its daemon got SIGTERM): with `graceful`, its ranks first stop at one agreed step."""
        reason = str(body.get("reason") or f"node {node_id} left")
        if body.get("graceful") and self.drain_departing(node_id, reason):
            return
        self.remove(node_id, NodeStatus.left, reason, now)
        self.send(node_id, MeshOp.left, {"reason": reason})

    def drain_departing(self, node_id: str, reason: str) -> bool:
        """Fold a leaving node into the transition in flight, or drain it; False when no drain can be had."""
        rnd = self.round
        if self.state != JobState.running or rnd is None or not rnd.has(node_id) \
                or node_id == self.cfg.node_id or self.nodes[node_id].status != NodeStatus.alive:
            return False
        if self.transition is None:
            self.begin_transition(TransitionKind.drain, [node_id], Role.standby, After.round,
                                  f"node {node_id} leaving: {reason}", hold=SIGNAL_WINDOW_S)
        self.fold_departing(node_id, reason)
        return True

    def fold_departing(self, node_id: str, reason: str) -> None:
        """Several preemption notices at once (a job-wide signal): one transition, one agreed step for all."""
        trans = self.transition
        assert trans is not None
        if trans.depart(node_id, reason):
            self.nodes[node_id].role = Role.draining
            self.emit(EventKind.node_role, node_id, role=Role.draining)

    def stop_gracefully(self, why: str, now: float) -> None:
        """The job ends once every shim rank saved at one agreed step: folded into a transition in flight.

        A transition whose ranks already agreed to resize in place saves nothing: the stop follows its round."""
        trans = self.transition
        if trans is None:
            self.begin_transition(TransitionKind.stop, [], Role.standby, After.end, why, hold=SIGNAL_WINDOW_S)
        elif trans.in_place:
            self.stop_after_round = why
        else:
            log.info("[%s] %s: folded into %s %s, which now ends the job", self.cfg.node_id, why, trans.kind,
                     trans.op_id)
            trans.then, trans.detail = After.end, why

    def remove(self, node_id: str, status: NodeStatus, detail: str, now: float, reform: bool = True) -> None:
        """The node is gone; `reform` starts a round without it (a caller that starts one itself says False)."""
        self.closed.pop(node_id, None)
        node = self.nodes.get(node_id)
        if node is None or node.status != NodeStatus.alive:
            return
        node.status = status
        self.emit(EventKind.node_lost if status == NodeStatus.lost else EventKind.node_left, node_id, reason=detail)
        self.replace_relay(node_id, now)
        if reform and self.round and self.round.has(node_id):
            self.suspect = None
            self.schedule(Cause.membership, detail, now)
        if node_id in self.stop_barrier:
            self.release_barrier(node_id)  # a lost daemon's workers died with it (PDEATHSIG)

    def replace_relay(self, node_id: str, now: float) -> None:
        """A relay went: the first of its group (join order) relays for the others now. Each moved member gets time
        to switch links: its link to a dead relay dropped with it, one to a relay cut off from us did not
        (Member.leave_a_silent_relay)."""
        self.told_route.pop(node_id, None)
        successor, moved = self.relays.remove(
            node_id, lambda n: (not self.nodes[n].relay_endpoint, self.nodes[n].joined_seq))
        if not moved:
            return
        for member in sorted(moved):
            record = self.nodes[member]
            record.via = self.relays.via.get(member, "")
            # A loss limit to notice (a relay cut off from us keeps its members' links up) and one to switch.
            record.last_seen = max(record.last_seen, now + self.cfg.lost_after_s)
            self.told_route[member] = now
            self.send(member, MeshOp.relay, {"via": self.via_endpoint(record)})
        self.emit(EventKind.relay_replaced, node_id, relay=successor, nodes=len(moved))

    def credit_stall(self, now: float) -> None:
        """Our own loop stood still (a GC pause, SIGSTOP, a long burst): the members' silence then is not theirs."""
        gap = now - self.last_tick if self.last_tick else 0.0
        self.last_tick = now
        if gap > STALL_S:
            log.warning("[%s] the coordinator did not run for %.1fs; members get that time back before any of "
                        "them is judged lost", self.cfg.node_id, gap)
            alive = self.alive()
            for node in alive:
                node.last_seen += gap
            # The members judge our silence too (member.py): a sign of life now, not at each one's next answer.
            rnd = self.round
            self.send_all([n.node_id for n in alive if n.node_id != self.cfg.node_id], MeshOp.hb,
                          {"seq": self.events.seq, "round": rnd.round_id if rnd else 0})

    def check_liveness(self, now: float) -> None:
        """A closed connection not back within the grace, or (a frozen or cut-off node) missed heartbeats."""
        for node_id, since in list(self.closed.items()):
            if now - since >= RECONNECT_GRACE_S and not self.lose_if_closed(node_id, now):
                del self.closed[node_id]  # it reconnected within the grace: a blip, not a death
        if now < self.liveness_due:
            return  # no member can be silent past the limit before then: a scan of all, every 50 ms tick, cost CPU
        oldest = now
        for node in self.alive():
            if node.node_id == self.cfg.node_id:
                continue
            if now - node.last_seen <= self.cfg.lost_after_s:
                oldest = min(oldest, node.last_seen)
            elif self.relay_silent(node, now):  # its frames wait at a relay that is late itself: not its silence
                oldest = min(oldest, now - self.cfg.lost_after_s + self.cfg.heartbeat_s)
            else:
                self.remove(node.node_id, NodeStatus.lost, f"node {node.node_id} missed "
                            f"{self.cfg.heartbeat_misses} heartbeats", now)
        # last_seen only moves forward, and a node added later is seen later: none is due before this
        self.liveness_due = oldest + self.cfg.lost_after_s

    def relay_silent(self, node: NodeRecord, now: float) -> bool:
        """Its relay's own beats are late too (2 intervals): the member's silence may be the relay's."""
        relay = self.nodes.get(node.via) if node.via else None
        return relay is not None and relay.status == NodeStatus.alive \
            and now - relay.last_seen > 2 * self.cfg.heartbeat_s

    def connection_lost(self, node_id: str, now: float) -> None:
        """The mesh saw this member's connection close: its daemon died, or its link reset.

        Lost once the reconnect grace passes without it back; at once when a peer's failure awaits its `pong`
        (that round is failing anyway, and a closed connection never answers).
        """
        node = self.nodes.get(node_id)
        if node is None or node.status != NodeStatus.alive or node_id == self.cfg.node_id:
            return
        self.closed.setdefault(node_id, now)
        if self.suspect is not None and node_id in self.suspect.awaiting:
            self.lose_if_closed(node_id, now)

    def lose_if_closed(self, node_id: str, now: float) -> bool:
        """Declare a member whose connection closed lost, unless it has reconnected meanwhile."""
        if self.connected(node_id):
            return False
        self.remove(node_id, NodeStatus.lost, f"node {node_id}'s connection closed", now)
        return True

    # ---- time ---------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Everything time decides: lost nodes, a settled round, a finished transition, expired queries."""
        if self.state in ENDED:
            return
        self.credit_stall(now)
        if not self.backlog():  # heartbeats may be waiting in the queue: judge only once it is drained
            self.check_liveness(now)
        self.start_pending_round(now)
        if self.stop_barrier and self.round and now - self.round.started_at > self.stop_limit(self.round):
            self.release_barrier(None, forced=True)
        if self.state == JobState.waiting and now - self.waiting_since > self.cfg.join_timeout_s:
            self.end(JobState.failed, f"join timeout: {self.reason} for {self.cfg.join_timeout_s:.0f}s", now)
        self.ask_step_when_due(now)
        self.finish_transition_if_ready(now)
        if self.resizer.expired(now):
            self.restart_after_resize(now)
        for query in self.agreement.expired(now):
            self.resolve_step(query)

    # ---- rounds -------------------------------------------------------------------------------
    def stop_limit(self, rnd: Round) -> float:
        """How long the stop barrier waits: a node of an in-place round first waits for its kept workers to leave
        their group (elasticd/member/in_place.py), and no rank may be in two worlds while it does."""
        current = self.resizer.current
        in_place = current is not None and current.round_id == rnd.round_id
        return stop_barrier_s(self.cfg.grace_s, in_place)

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
        if self.transition is not None and pending.cause in (Cause.membership, Cause.operator) \
                and not self.round_lost_a_member():
            return  # a graceful stop is in flight; its end starts the round (a lost member abandons it)
        if self.awaiting_announced(self.tally.count(ACTIVE), now) \
                or (self.round is None and self.resizer.store_pending) \
                or (pending.cause in (Cause.membership, Cause.operator)  # a failure's round cannot wait
                    and self.resizer.warming_up({n.node_id for n in self.alive()}, now)):
            return
        self.pending = None
        if not self.reform_first(pending):
            self.start_round(pending.cause, pending.detail, pending.detected_at, now)

    def round_lost_a_member(self) -> bool:
        return self.round is not None and any(self.nodes[n].status != NodeStatus.alive for n in self.round.node_ids())

    def candidates(self) -> list[NodeRecord]:
        """Active nodes up to the target, promoting standbys when the job is below it."""
        alive = sorted(self.alive(), key=lambda n: n.joined_seq)
        order = sticky_order(self.round.node_ids() if self.round else [],
                             [n for n in alive if n.role == Role.active])
        cap = min(self.target, self.cfg.max_nodes)
        for node in alive:
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
        self.abandon_transition()
        self.reformed = False
        members = self.candidates()
        previous = self.round
        if len(members) < self.cfg.min_nodes:
            if self.state != JobState.waiting:
                self.waiting_since, self.told_waiting = now, set()
            self.state = JobState.waiting
            self.reason = (f"waiting for {self.cfg.min_nodes - len(members)} more node(s): "
                           f"{len(members)} active, --nnodes min is {self.cfg.min_nodes}")
            self.emit(EventKind.waiting, reason=self.reason, join_timeout_s=self.cfg.join_timeout_s)
            # Each member hears once that the job waits (a newcomer when it comes): telling all of them again at
            # every registration made N daemons that start one by one cost O(N²) frames. `status` has the count.
            untold = [n.node_id for n in self.alive() if n.node_id not in self.told_waiting]
            self.told_waiting.update(untold)
            self.send_all(untold, MeshOp.round, {"round": None, "state": JobState.waiting, "reason": self.reason})
            return
        if previous is not None and self.state == JobState.running:
            self.restarts[cause] += 1
            for node_id in previous.node_ids():  # these nodes' workers are restarted by this round
                node = self.nodes.get(node_id)
                if node is not None and node.status == NodeStatus.alive:  # a new dict: the store sees the change
                    node.restarts = {**node.restarts, cause: node.restarts[cause] + 1}
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
        self.stopped_at, self.spawned_at, self.resent, self.reported = {}, {}, {}, set()
        self.done_nodes = set()
        self.stop_barrier = {n for n in (previous.node_ids() if previous else [])
                             if n in self.nodes and self.nodes[n].status == NodeStatus.alive}
        self.store.put_round(rnd)
        self.emit(EventKind.round_started, round=round_id, world_size=world, cause=rnd.cause, detail=detail,
                  rank_map={e.node_id: e.ranks for e in entries}, in_place=in_place)
        for node in self.alive():
            self.send(node.node_id, MeshOp.round, self.assignment(node.node_id))
        self.release_barrier(None)

    def release_barrier(self, stopped: str | None, forced: bool = False) -> None:
        """A node's old workers are gone; once every one is, the members may start the new round's."""
        rnd = self.round
        if stopped is not None:
            self.stop_barrier.discard(stopped)
        if rnd is None or (self.stop_barrier and not forced) or rnd.timeline.get("go"):
            return
        if forced:
            self.emit(EventKind.stop_barrier_timeout, round=rnd.round_id, nodes=sorted(self.stop_barrier))
            self.stop_barrier = set()
        rnd.timeline["go"] = self.clock()
        self.send_all(rnd.node_ids(), MeshOp.go, {"round": rnd.round_id})

    def assignment(self, node_id: str) -> dict[str, Any]:
        rnd = self.round
        assert rnd is not None
        entry = rnd.entry(node_id)
        node = self.nodes[node_id]
        return {
            "round": rnd.round_id, "state": JobState.running if entry else node.role,
            "group_rank": entry.group_rank if entry else None,
            "group_world_size": len(rnd.members), "ranks": entry.ranks if entry else [],
            "world_size": rnd.world_size, "master_addr": rnd.master_addr, "master_port": rnd.master_port,
            "restart_count": self.restarts[Cause.failure], "max_restarts": self.cfg.max_restarts,
            "store_tunnel": self.nodes[rnd.members[0].node_id].store_tunnel,  # rank 0's node: it hosts the store
            "node_restarts": dict(node.restarts),  # for the node's own metrics (elasticd/daemon/exporter.py)
            **self.resizer.fields(rnd, entry is None and node.role == Role.standby),
        }

    def round_progress(self, node_id: str, body: dict[str, Any]) -> None:
        rnd = self.round
        current = rnd is not None and body.get("round") == rnd.round_id
        step = (node_id, "stopped" if "stopped" in body else "spawned")
        if not (current and step in self.reported):  # a report sent again (we asked again) was logged once
            for event in body.get("events") or ():  # the node's events that go with it: workers stopped, started
                if isinstance(event, dict):
                    self.adopt(event, node_id)
        if rnd is None or not current:
            return
        self.reported.add(step)
        if "stopped" in body:
            self.release_barrier(node_id)
        if rnd.entry(node_id) is None:
            return
        for phase, seen in (("stopped", self.stopped_at), ("spawned", self.spawned_at)):
            if phase in body:
                seen.setdefault(node_id, float(body[phase]))
        if len(self.spawned_at) == len(rnd.members) and "spawned" not in rnd.timeline:
            rnd.timeline["stopped"] = max(self.stopped_at.get(n, rnd.timeline["rendezvous"]) for n in rnd.node_ids())
            rnd.timeline["spawned"] = max(self.spawned_at.values())
            self.emit(EventKind.round_complete, round=rnd.round_id, cause=rnd.cause, timeline=self.timeline(rnd))
        self.resizer.progress(node_id, body, rnd)

    def first_step(self, node_id: str, round_id: int, at: float) -> None:
        rnd = self.round
        if rnd and round_id == rnd.round_id and "first_step" not in rnd.timeline:
            rnd.timeline["first_step"] = at
            self.emit(EventKind.first_step, node_id, round=round_id, cause=rnd.cause, timeline=self.timeline(rnd))
            self.resizer.first_step(rnd, at)
            if self.stop_after_round and self.transition is None and self.state == JobState.running:
                why, self.stop_after_round = self.stop_after_round, ""
                self.begin_transition(TransitionKind.stop, [], Role.standby, After.end, why)

    @staticmethod
    def timeline(rnd: Round) -> dict[str, float]:
        """Seconds from detection to each phase, in phase order."""
        start = rnd.timeline["detect"]
        phases = ("detect", "rendezvous", "stopped", "go", "spawned", "first_step")
        return {p: round(rnd.timeline[p] - start, 3) for p in phases if p in rnd.timeline}

    # ---- failures -----------------------------------------------------------------------------
    def worker_failed(self, node_id: str, body: dict[str, Any], now: float) -> None:
        rnd = self.round
        if rnd is None or body.get("round") != rnd.round_id or self.state != JobState.running:
            return
        if self.pending is not None or self.suspect is not None:
            return  # this round is already being replaced; its later failures are echoes
        others = {n for n in rnd.node_ids() if n not in (node_id, self.cfg.node_id)}
        self.suspect = Suspect(node_id, body, set(others))
        self.send_all(sorted(others), MeshOp.probe, {"round": rnd.round_id})  # a copy: answers shrink the set
        for other in sorted(others & self.closed.keys()):  # a member whose connection closed never answers
            self.lose_if_closed(other, now)
        self.confirm_failure(now)

    def pong(self, node_id: str, now: float) -> None:
        if self.suspect is not None:
            self.suspect.awaiting.discard(node_id)
            self.confirm_failure(now)

    def confirm_failure(self, now: float) -> None:
        """Every other member answered: the failure is the worker's own, and it is charged."""
        suspect = self.suspect
        if suspect is None or suspect.awaiting:
            return
        self.suspect = None
        cause = Cause.hang if suspect.report.get("hang") else Cause.failure
        detail = str(suspect.report.get("reason", f"worker failed on node {suspect.node_id}"))
        if cause == Cause.failure and self.restarts[Cause.failure] >= self.cfg.max_restarts:
            self.end(JobState.failed, f"{detail}; --max-restarts {self.cfg.max_restarts} exhausted "
                     f"({self.restarts[Cause.failure]} failure restart(s) used)", now)
            return
        self.schedule(cause, detail, float(suspect.report.get("detected", now)), due=now)  # a failed round is dead

    def node_done(self, node_id: str, body: dict[str, Any], now: float) -> None:
        rnd = self.round
        if rnd is None or body.get("round") != rnd.round_id:
            return
        self.done_nodes.add(node_id)
        self.emit(EventKind.node_done, node_id, round=rnd.round_id)
        if set(rnd.node_ids()) <= self.done_nodes and self.pending is None and self.transition is None:
            self.end(JobState.succeeded, f"every worker of the final round finished (world {rnd.world_size})", now)

    def end(self, state: JobState, reason: str, now: float) -> None:
        if self.state in ENDED:
            return
        self.state, self.reason, self.ended_at = state, reason, now
        self.pending = self.transition = None
        self.emit(EventKind.job_end, state=state, reason=reason)
        self.send_all([n.node_id for n in self.alive()], MeshOp.job_end, {"state": state, "reason": reason})

    # ---- graceful transitions and step agreement ----------------------------------------------------
    def begin_transition(self, kind: TransitionKind, leaving: list[str], final_role: Role, then: After,
                         detail: str, cause: Cause = Cause.membership, detected: float = 0.0,
                         hold: float = 0.0) -> str:
        """Shim workers stop at one agreed step, plain ones get SIGTERM; returns the op id.

        `hold` delays the step's question (a signal's window: more leaves may fold in first)."""
        assert self.round is not None
        op_id, now = new_id(), self.clock()
        for node_id in leaving:
            self.nodes[node_id].role = Role.draining
            self.emit(EventKind.node_role, node_id, role=Role.draining)
        # Every member is awaited until the step agreement says otherwise: with no shim worker anywhere
        # (at_step null) there is nothing to wait for, and the round's SIGTERM stops the plain workers.
        trans = Transition(op_id, kind, leaving, final_role, then, set(self.round.node_ids()),
                           now + DRAIN_TIMEOUT_S, detected or now, cause, detail)
        self.transition = trans
        self.emit(trans.events.started, op_id=op_id, nodes=leaving, detail=detail)
        trans.ask_at = now + hold
        self.ask_step_when_due(now)  # `step_agreed` carries the step every rank stops at
        return op_id

    def ask_step_when_due(self, now: float) -> None:
        trans = self.transition
        if trans is not None and not trans.asked and now >= trans.ask_at:
            trans.asked = True
            self.ask_step(trans.op_id, StepRequest.drain)

    def node_drained(self, node_id: str, now: float) -> None:
        trans = self.transition
        if trans is not None and node_id in trans.awaiting:
            trans.awaiting.discard(node_id)
            self.emit(trans.events.progress, node_id, op_id=trans.op_id, remaining=sorted(trans.awaiting))
            self.finish_transition_if_ready(now)

    def finish_transition_if_ready(self, now: float) -> None:
        trans = self.transition
        if trans is None or (trans.awaiting and now < trans.deadline):
            return
        self.transition = None
        for node_id in trans.leaving:
            if node_id not in trans.departing:
                self.nodes[node_id].role = trans.final_role
                self.emit(EventKind.node_role, node_id, role=trans.final_role)
        self.emit(trans.events.complete, op_id=trans.op_id, nodes=trans.leaving, timed_out=bool(trans.awaiting),
                  duration_s=round(now - trans.started, 3))
        self.let_go(trans, now)
        if trans.then == After.end:
            self.end(JobState.stopped, f"{trans.detail} ({trans.op_id})", now)
        elif self.cfg.node_id in trans.departing:
            return  # our own node left (a handover on etcd): the next coordinator forms the round without it
        else:
            self.schedule(trans.cause, trans.detail, trans.started, due=now)
            self.reformed = True
            self.start_pending_round(now)  # at once, not at the next tick: the ranks wait for it

    def abandon_transition(self) -> None:
        """A round that starts anyway (a failure, a lost node) ends a graceful stop where it stands."""
        trans, self.transition = self.transition, None
        if trans is not None:
            for node_id in trans.leaving:
                self.nodes[node_id].role = trans.final_role
            self.emit(trans.events.abandoned, op_id=trans.op_id, reason="a new round started first")
            self.let_go(trans, self.clock())

    def let_go(self, trans: Transition, now: float) -> None:
        """The nodes that asked to leave are out: the round that follows is formed without them."""
        for node_id, reason in trans.departing.items():
            self.remove(node_id, NodeStatus.left, reason, now, reform=False)
            self.send(node_id, MeshOp.left, {"reason": reason})

    def reform_first(self, pending: PendingRound) -> bool:
        """Before a round that restarts healthy shim workers (a join, scale up, restart), stop them at one step.

        Returns True when it started that graceful stop; the round follows when every rank has saved and stopped.
        A round after a failure or a lost node cannot wait: its workers are failing already.
        """
        if self.reformed or pending.cause not in (Cause.membership, Cause.operator):
            return False
        if self.state != JobState.running or self.round is None:
            return False
        if self.round_lost_a_member():
            return False
        self.begin_transition(TransitionKind.reform, [], Role.active, After.round, pending.detail, pending.cause,
                              pending.detected_at)
        return True

    def ask_step(self, op_id: str, request: StepRequest) -> None:
        assert self.round is not None
        self.agreement.ask(op_id, request, self.round.node_ids(), self.clock())

    def on_step_report(self, sender: str, body: dict[str, Any], _now: float) -> None:
        query = self.agreement.answer(sender, body)
        if query is not None:
            self.resolve_step(query)

    def resolve_step(self, query: StepQuery) -> None:
        if self.round is None or self.state != JobState.running:
            return
        at_step = query.at_step()
        trans = self.transition
        ours = trans is not None and trans.op_id == query.op_id
        request = query.request
        # A handover (our own node departing, etcd) drains with a checkpoint: the next coordinator's round restarts.
        if ours and trans is not None and self.keeps_state_in_place(trans) and at_step is not None \
                and request == StepRequest.drain and self.resizer.agree(query, self.clock()):
            request = StepRequest.resize  # every rank leaves its group at that step and keeps its process
            trans.in_place = True
        self.emit(EventKind.step_agreed, op_id=query.op_id, op=request, at_step=at_step)
        if ours and trans is not None:  # no shim worker reports steps (there): nobody will say `drained`
            trans.awaiting = set() if at_step is None else trans.awaiting - query.plain
        # Nodes that said they run no shim rank have nobody to tell (a plain job's drain asks nothing of anyone);
        # one that did not answer in time is told anyway.
        self.send_all([n for n in self.round.node_ids() if n not in query.plain], WORKER_OPS[request],
                      {"request_id": query.op_id, "at_step": at_step})

    def keeps_state_in_place(self, trans: Transition) -> bool:
        """Whether a round follows that holds the ranks' state without a checkpoint: not when the job ends, our
        own node hands over (etcd), or fewer than --nnodes min stay (their workers would be stopped to wait)."""
        assert self.round is not None
        return trans.then == After.round and self.cfg.node_id not in trans.departing \
            and len(trans.stays(self.round.node_ids())) >= self.cfg.min_nodes

    def resize_failed(self, round_id: int, reason: str, now: float) -> None:
        if self.resizer.failed(round_id, reason):
            self.restart_after_resize(now)

    def restart_after_resize(self, now: float) -> None:
        """An in-place round failed: today's restart path, at once (its ranks are waiting, not training)."""
        rnd = self.round
        if rnd is None or self.state != JobState.running:
            return
        self.reformed = True  # no step to agree: the ranks are out of any group
        self.schedule(rnd.cause, f"in-place resize failed: {self.resizer.fall_back}", now, due=now)

    # ---- reading ------------------------------------------------------------------------------
    def status(self, now: float, offset: int = 0, limit: int | None = None) -> dict[str, Any]:
        """The job summary, and one page of the node list in join order (all of it when `limit` is None)."""
        rnd = self.round
        ordered = sorted(self.nodes.values(), key=lambda n: n.joined_seq)
        page = ordered[offset:] if limit is None else ordered[offset:offset + limit]
        return {
            "job_id": self.cfg.job_id, "state": self.state, "reason": self.reason,
            "round": rnd.round_id if rnd else 0, "world_size": rnd.world_size if rnd else 0,
            "min_nodes": self.cfg.min_nodes, "max_nodes": self.cfg.max_nodes, "target": self.target,
            "coordinator": self.cfg.node_id, "restarts": dict(self.restarts),
            "max_restarts": self.cfg.max_restarts,
            "last_recovery": self.timeline(rnd) if rnd else {},
            "rank_map": rnd.public()["members"] if rnd else [],
            "nodes": [n.public(now) for n in page], "nodes_total": len(ordered), "nodes_offset": offset,
            "node_counts": self.tally.groups(), "relays": len(self.relays.groups),
            "seq": self.events.seq,
            **self.status_extra(),
        }

    def rank_map(self, order: list[str]) -> tuple[dict[str, list[int]], int]:
        """Each node's global ranks in a round of `order`, and its world size: a verb's plan (commands/port.py)."""
        entries, world = build_rank_map(order, self.nodes)
        return {e.node_id: e.ranks for e in entries}, world
