"""--rdzv-backend etcd in the daemon: the elected daemon runs the coordinator, the others follow whoever leads.

Every daemon binds a mesh ROUTER of its own and stands for election (elasticd/coordinator/etcd/election.py). The
winner rebuilds the coordinator from etcd (elasticd/coordinator/etcd/store.py) and serves its ROUTER; the others
point their DEALER at it and register again. Fencing: the store's txns compare the epoch, every coordinator
message carries it and members drop lower ones, and a coordinator whose lease may have lapsed does nothing (its
members' frames wait) until etcd confirms it still leads, or it learns it does not and joins the new coordinator
as a member.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol

import zmq
import zmq.asyncio

from elasticd.coordinator import inbox
from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.etcd.client import EtcdClient
from elasticd.coordinator.etcd.election import EtcdHealth, Leader
from elasticd.coordinator.etcd.errors import EtcdClusterChanged, EtcdUnavailable
from elasticd.coordinator.etcd.leader_probe import PROBE_AFTER_S, lease_of, refuses_connections
from elasticd.coordinator.etcd.store import Deposed, EtcdStore, Snapshot, StoreUnavailable
from elasticd.coordinator.transitions import SIGNAL_WINDOW_S
from elasticd.daemon.etcd_session import EtcdSession
from elasticd.daemon.takeover import job_record, reset_events, restore
from elasticd.job.config import JobConfig, StartError
from elasticd.job.events import EventLog
from elasticd.keys.auth import NodeKeys
from elasticd.member.agent import NodeAgent
from elasticd.member.beats import PortPool
from elasticd.mesh.coordinator_mesh import CoordinatorMesh
from elasticd.mesh.member_mesh import MemberMesh
from elasticd.wire.assignment import Fenced
from elasticd.wire.member_state import Heartbeat
from elasticd.wire.names import (
    ENDED,
    After,
    EventKind,
    JobState,
    MeshOp,
    NodeState,
    NodeStatus,
    Role,
    TransitionKind,
)
from elasticd.wire.protocol import Envelope, ProtocolError

log = logging.getLogger("elasticd")
SYNC_EVERY_S = 0.1  # how often the coordinator's changes (roles, events, timelines) go to etcd
HELD_FRAMES = 10_000  # members' frames kept while the coordinator may not act (its lease unconfirmed)


class Seat(Protocol):
    """The daemon's one seam for failover: the roles it holds change only through these (daemon.py)."""

    @property
    def coordinator(self) -> Coordinator | None: ...  # the role we hold now; None: we follow another daemon's
    @property
    def member_mesh(self) -> MemberMesh | None: ...  # our member's link to the coordinator it follows
    def seat_coordinator(self, coordinator: Coordinator, mesh: CoordinatorMesh, now: float) -> None: ...
    def unseat_coordinator(self) -> None: ...  # we no longer lead
    def drop_stale_coordinator(self) -> None: ...  # we still lead, but our coordinator's state is not etcd's
    def repoint_member(self, endpoint: str) -> MemberMesh: ...  # a new link, to the coordinator at `endpoint`
    def rejoin(self, now: float) -> None: ...  # our member registers again, with whoever it follows now


class Host(Seat, Protocol):
    """The rest of what failover uses of its daemon: the switchboard's entries, and the daemon's end."""

    def on_peer(self, sender: str, env: Envelope) -> None: ...
    def on_connection_closed(self, node_id: str) -> None: ...
    def to_member(self, env: Envelope) -> None: ...
    def send_to_node(self, node_id: str, op: MeshOp, body: dict[str, Any]) -> None: ...
    def send_to_nodes(self, node_ids: list[str], op: MeshOp, body: dict[str, Any]) -> None: ...
    def on_job_event(self, event: dict[str, Any]) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...
    async def finish(self, state: str, reason: str, code: int | None = None, message: str = "") -> None: ...
    def fail(self, reason: str, message: str) -> None: ...


def candidate_mesh(cfg: JobConfig, ctx: zmq.asyncio.Context, host: str, keys: NodeKeys | None) -> CoordinatorMesh:
    """Our ROUTER, on the advertised address: in --port-range when given (a firewall admits it), else ephemeral."""
    port: int | str = "*"
    if cfg.port_range is not None:
        low, high = cfg.port_range
        # A free port first: a bind that fails names the whole range in its error, not one port.
        port = next((p for p in range(low, high + 1) if PortPool(host).free(p)), 0)
        if not port:
            raise StartError(f"no free port for the mesh in --port-range {low}-{high} on {host}")
    return CoordinatorMesh(ctx, f"tcp://{host}:{port}", cfg.node_id, keys)


class Failover:
    """The daemon's side of the election: takes the coordinator role, gives it up, re-points the member."""

    def __init__(self, cfg: JobConfig, client: EtcdClient, mesh: CoordinatorMesh, node: NodeAgent,
                 events: EventLog, daemon: Host) -> None:
        self.cfg, self.mesh, self.node, self.events, self.d = cfg, mesh, node, events, daemon
        self.etcd = EtcdSession(cfg, client, node.instance, mesh.sock.getsockopt_string(zmq.LAST_ENDPOINT),
                                self.on_leader, self.on_health, self.on_fatal)
        self.leader: Leader | None = None
        self.epoch = 0  # the highest epoch heard of: a coordinator message below it is a deposed one's
        self.store: EtcdStore | None = None
        self.serving: asyncio.Task[Any] | None = None
        self.held: list[tuple[str, Envelope]] = []
        self.frozen_logged = False
        self.rebuild = False  # a round was not made durable: rebuild the coordinator from etcd before going on
        self.last_sync = 0.0
        self.ending = False  # the etcd outage limit passed: the job is being stopped

    # ---- start and stop ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.etcd.start()

    def close(self) -> None:
        """Our last state change written, then the lease revoked: the next daemon takes over at once."""
        if self.store is not None:
            self.store.close()
        self.etcd.resign()
        if self.serving is not None:
            self.serving.cancel()
        self.mesh.close()

    # ---- what the election says ---------------------------------------------------------------------------
    def on_leader(self, leader: Leader | None) -> None:
        self.leader = leader
        if self.node.state == NodeState.ending:
            return  # this daemon is on its way out: it follows nobody any more
        if leader is None:  # our lease is gone: whatever we were, we are not the coordinator now
            self.step_down("our etcd lease expired")
            return
        self.epoch = max(self.epoch, leader.epoch)
        if self.etcd.leads(leader):
            if self.d.coordinator is None:
                self.take_over(leader)
            return
        self.step_down(f"node {leader.node_id} leads (epoch {leader.epoch})")
        self.follow(leader)

    def on_health(self, health: EtcdHealth) -> None:
        c = self.d.coordinator
        if c is not None:
            kind = EventKind.etcd_restored if health.ok else EventKind.etcd_unreachable
            c.emit(kind, detail=health.detail, outage_limit_s=self.cfg.etcd_outage_s)

    def on_fatal(self, message: str) -> None:
        self.d.fail(message, f"--rdzv-backend etcd: {message}")

    # ---- coordinator role ----------------------------------------------------------------------------------
    def take_over(self, leader: Leader) -> None:
        """Rebuild the coordinator from etcd, serve our ROUTER, and seat it in the daemon."""
        now = time.time()
        try:
            snap = Snapshot.read(self.etcd.client, self.etcd.prefix)
        except (EtcdUnavailable, EtcdClusterChanged) as exc:
            log.warning("[%s] etcd: cannot read the job's state to take over (%s); retrying", self.cfg.node_id, exc)
            self.rebuild = True
            return
        fresh = snap.job.get("state") in ENDED  # a finished job of the same id: this is a new run
        if fresh:
            snap = Snapshot(alive=snap.alive)
        events = self.events
        reset_events(events, snap.events)
        store = EtcdStore(self.etcd.client, self.etcd.prefix, leader.key, leader.epoch,
                          event_capacity=events.capacity, snapshot=snap, fresh=fresh)
        self.mesh.forget()  # only daemons that register with us now are routes
        c = Coordinator(self.cfg, store, self.send, events, self.d.on_job_event, connected=self.mesh.connected,
                        backlog=self.mesh.backlog, send_all=self.send_all)
        self.mesh.route_by(c.relays.via_of)
        c.status_extra = lambda: self.etcd.status(self.leader.epoch if self.leader else 0)
        store.job_state = lambda: job_record(c)
        store.events_since = lambda seq: events.query(since_seq=seq, limit=0)
        restore(c, snap, now)
        self.store, self.rebuild, self.held = store, False, []
        self.serving = asyncio.create_task(self.mesh.serve(self.d.on_peer, self.d.on_connection_closed))
        c.emit(EventKind.coordinator_elected, epoch=leader.epoch, previous=snap.job.get("coordinator", ""),
               restored_round=c.round.round_id if c.round else 0)
        self.d.seat_coordinator(c, self.mesh, now)  # our node's member registers with us, or goes on as it was

    def step_down(self, why: str) -> None:
        if self.d.coordinator is None:
            return
        log.warning("[%s] no longer the coordinator: %s; following the new one as a member", self.cfg.node_id, why)
        self.d.unseat_coordinator()  # our node was registered with us: with the new coordinator it registers again
        self.retire_store()
        if self.serving is not None:
            self.serving.cancel()
            self.serving = None
        self.held = []

    def retire_store(self) -> None:
        """Nothing more of ours reaches etcd: what the store still had queued is dropped."""
        if self.store is not None:
            self.store.deposed = True
            self.store.close(0.0)
            self.store = None

    # ---- member role --------------------------------------------------------------------------------------
    def follow(self, leader: Leader) -> None:
        """Point the DEALER at the leader and register with it (the same instance: a takeover costs no round)."""
        link = self.d.member_mesh
        if link is None or link.coordinator != leader.endpoint:
            mesh = self.d.repoint_member(leader.endpoint)
            mesh.on_coordinator_down = lambda: self.coordinator_link_down(mesh)
            self.d.spawn(self.serve_member(mesh))
        self.d.rejoin(time.time())

    def coordinator_link_down(self, mesh: MemberMesh) -> None:
        leader = self.leader
        if mesh is self.d.member_mesh and leader is not None and leader.endpoint == mesh.coordinator:
            self.d.spawn(self.replace_if_dead(mesh, leader))

    async def replace_if_dead(self, mesh: MemberMesh, leader: Leader) -> None:
        """The coordinator's link dropped: if its host refuses its port, its daemon is dead, and its lease goes now
        rather than at its TTL (elasticd/coordinator/etcd/leader_probe.py says why only then)."""
        await asyncio.sleep(PROBE_AFTER_S)
        if mesh.link_up or mesh is not self.d.member_mesh or self.leader != leader:
            return
        me = self.cfg.node_id
        if not await refuses_connections(leader.endpoint):
            log.info("[%s] coordinator %s's link dropped but %s does not refuse connections (frozen, or the network "
                     "is cut): its lease decides", me, leader.node_id, leader.endpoint)
            return
        log.warning("[%s] coordinator %s's daemon is gone (%s refuses connections): revoking its etcd lease so the "
                    "next daemon takes over now", me, leader.node_id, leader.endpoint)
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.etcd.client.revoke, lease_of(leader))
        except Exception as exc:  # revoked by another member already, or etcd away: its lease still expires
            log.info("[%s] etcd: revoking coordinator %s's lease: %s", me, leader.node_id, exc)

    async def serve_member(self, mesh: MemberMesh) -> None:
        with contextlib.suppress(zmq.ZMQError, asyncio.CancelledError):  # closed by a re-point
            await mesh.serve(lambda _sender, env: self.from_coordinator(mesh, env))

    def from_coordinator(self, mesh: MemberMesh, env: Envelope) -> None:
        if mesh is not self.d.member_mesh:
            return  # the DEALER of a coordinator we no longer follow
        if env.type == "rep":  # the answer to an operator request we forwarded: not a decision
            self.d.to_member(env)
            return
        try:
            epoch = Fenced.decode(env.body, env.op, env.size).epoch
        except ProtocolError as err:
            log.warning("mesh: malformed %s from the coordinator dropped: %s", env.op, err.reason)
            return
        if epoch < self.epoch:
            log.debug("mesh: %s of epoch %d dropped (current %d)", env.op, epoch, self.epoch)
            return  # a deposed coordinator's word (fencing on the mesh)
        self.epoch = epoch
        self.d.to_member(env)

    # ---- the coordinator's loop -------------------------------------------------------------------------
    def send(self, node_id: str, op: MeshOp, body: dict[str, Any]) -> None:
        """Every coordinator message carries its epoch."""
        self.d.send_to_node(node_id, op, self.fenced(body))

    def send_all(self, node_ids: list[str], op: MeshOp, body: dict[str, Any]) -> None:
        """A broadcast with the epoch, still encoded once for every member (daemon.py `send_to_nodes`)."""
        self.d.send_to_nodes(node_ids, op, self.fenced(body))

    def fenced(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "epoch": self.leader.epoch if self.leader else 0}

    def receive(self, sender: str, env: Envelope) -> None:
        """A member's frame: handled now while our lease is certain, else kept for when it is (or dropped)."""
        c = self.d.coordinator
        if c is None:
            return
        if self.etcd.may_act():
            c.receive(sender, env, time.time())
        elif env.op == MeshOp.hb:  # no decision, no answer; `status` and the console still see who is alive
            beat = inbox.decode(sender, env)
            if isinstance(beat, Heartbeat):
                c.heartbeat(sender, beat, time.time())
        elif len(self.held) < HELD_FRAMES:
            self.held.append((sender, env))

    def tick(self, now: float) -> None:
        c = self.d.coordinator
        if self.etcd.outage_over(now):
            self.outage_ends_job(now)
            return
        if self.rebuild and self.leader is not None and self.etcd.leads(self.leader):
            self.retire_store()  # what it still had queued must not land after the state is re-read
            self.d.drop_stale_coordinator()
            self.take_over(self.leader)
            return
        if c is None or self.store is None:
            return
        if self.store.deposed:
            self.step_down("a fenced write failed")
            return
        me = c.nodes.get(self.cfg.node_id)
        if me is not None and me.status != NodeStatus.alive:
            return  # we handed over (SIGTERM): the round without us is the next coordinator's
        if not self.etcd.may_act():
            if not self.frozen_logged:
                self.frozen_logged = True
                log.warning("[%s] coordinator: our etcd lease is not confirmed; no decisions until it is",
                            self.cfg.node_id)
            return
        self.frozen_logged = False
        held, self.held = self.held, []
        for sender, env in held:
            c.receive(sender, env, now)
        try:
            c.tick(now)
        except Deposed:
            self.step_down("a fenced write failed: a newer coordinator holds the job")
            return
        except StoreUnavailable as exc:
            log.warning("[%s] coordinator: %s; rebuilding from etcd before any other decision", self.cfg.node_id,
                        exc)
            self.rebuild = True
            return
        if now - self.last_sync >= SYNC_EVERY_S:
            self.last_sync = now
            self.store.sync()

    def outage_ends_job(self, now: float) -> None:
        if self.ending:
            return
        self.ending = True
        reason = (f"etcd unreachable for {now - self.etcd.health.since:.0f}s (--rdzv-conf etcd_outage_timeout="
                  f"{self.cfg.etcd_outage_s:g}): the job stops")
        c = self.d.coordinator
        if c is not None and c.state not in ENDED:
            c.end(JobState.failed, reason, now)
        self.d.spawn(self.d.finish(JobState.failed, reason, 1, reason))

    # ---- signals -------------------------------------------------------------------------------------------
    def may_drain_own_node(self) -> bool:
        """Whether our node, leaving, can drain like any member's before the handover: the job runs on a round
        that holds it (else it departs at once)."""
        c = self.d.coordinator
        rnd = c.round if c is not None else None
        return c is not None and c.state == JobState.running and rnd is not None and rnd.has(self.cfg.node_id)

    def drain_own_node(self, reason: str) -> None:
        """SIGTERM on the coordinator's daemon: its node drains like any member's, then the role goes on."""
        c, me = self.d.coordinator, self.cfg.node_id
        assert c is not None
        log.info("[%s] leaving gracefully (%s); the coordinator role goes to the next daemon", me, reason)
        if c.transition is None:
            c.begin_transition(TransitionKind.drain, [me], Role.standby, After.round,
                               f"node {me} leaving: {reason} (coordinator handover)", hold=SIGNAL_WINDOW_S)
        c.fold_departing(me, reason)  # with the members' leaves in flight (a job-wide signal): one agreed step
