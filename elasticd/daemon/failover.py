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

from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.etcd.client import EtcdClient, EtcdClusterChanged, EtcdUnavailable
from elasticd.coordinator.etcd.election import Elector, EtcdHealth, Leader
from elasticd.coordinator.etcd.leader_probe import PROBE_AFTER_S, lease_of, refuses_connections
from elasticd.coordinator.etcd.store import Deposed, EtcdStore, Snapshot, StoreUnavailable, job_prefix
from elasticd.coordinator.transitions import SIGNAL_WINDOW_S
from elasticd.job.config import JobConfig, StartError
from elasticd.job.events import EventLog
from elasticd.keys.auth import NodeKeys
from elasticd.member.agent import NodeAgent
from elasticd.member.beats import PortPool
from elasticd.member.link import Member
from elasticd.mesh.coordinator_mesh import CoordinatorMesh
from elasticd.mesh.member_mesh import MemberMesh
from elasticd.wire.names import (
    ENDED,
    After,
    Cause,
    EventKind,
    JobState,
    MeshOp,
    NodeState,
    NodeStatus,
    Role,
    TransitionKind,
)
from elasticd.wire.protocol import Envelope

log = logging.getLogger("elasticd")
# After a takeover every member gets this long on top of the heartbeat rule to find the new coordinator.
TAKEOVER_GRACE_S = 3.0
SYNC_EVERY_S = 0.1  # how often the coordinator's changes (roles, events, timelines) go to etcd
HELD_FRAMES = 10_000  # members' frames kept while the coordinator may not act (its lease unconfirmed)


class Host(Protocol):
    """What failover needs of the daemon (elasticd/daemon/daemon.py): its parts, and the roles' slots it fills."""

    cfg: JobConfig
    ctx: zmq.asyncio.Context
    host: str
    keys: NodeKeys | None
    node: NodeAgent
    member: Member
    events: EventLog
    coordinator: Coordinator | None
    coord_mesh: CoordinatorMesh | None
    member_mesh: MemberMesh | None
    exit_message: str

    def on_job_event(self, event: dict[str, Any]) -> None: ...
    def on_peer(self, sender: str, env: Envelope) -> None: ...
    def on_connection_closed(self, node_id: str) -> None: ...
    def send_to_node(self, node_id: str, op: MeshOp, body: dict[str, Any]) -> None: ...
    def send_to_nodes(self, node_ids: list[str], op: MeshOp, body: dict[str, Any]) -> None: ...
    def to_coord(self, op: MeshOp, body: dict[str, Any]) -> None: ...
    def new_member_mesh(self, endpoint: str) -> MemberMesh: ...
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...
    async def finish(self, state: str, reason: str, code: int | None = None, message: str = "") -> None: ...
    async def start_job_store(self, coordinator: Coordinator) -> None: ...


class Failover:
    """The daemon's side of the election: takes the coordinator role, gives it up, re-points the member."""

    def __init__(self, daemon: Host) -> None:
        self.d = daemon
        cfg = daemon.cfg
        self.prefix = job_prefix(cfg.job_id)
        try:
            self.client = EtcdClient(list(cfg.etcd_endpoints))
        except ImportError as exc:
            raise StartError(str(exc)) from None
        self.mesh = self.bind_mesh()
        self.endpoint = self.mesh.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.elector = Elector(self.client, self.prefix, cfg.node_id, daemon.node.instance, self.endpoint,
                               cfg.lease_ttl_s, self.threadsafe(self.on_leader), self.threadsafe(self.on_health),
                               self.threadsafe(self.on_fatal))
        self.loop: asyncio.AbstractEventLoop | None = None
        self.leader: Leader | None = None
        self.epoch = 0  # the highest epoch heard of: a coordinator message below it is a deposed one's
        self.store: EtcdStore | None = None
        self.serving: asyncio.Task[Any] | None = None
        self.member_endpoint = ""
        self.held: list[tuple[str, Envelope]] = []
        self.frozen_logged = False
        self.rebuild = False  # a round was not made durable: rebuild the coordinator from etcd before going on
        self.health = EtcdHealth(True, time.time(), "")
        self.last_sync = 0.0
        self.ending = False  # the etcd outage limit passed: the job is being stopped

    def bind_mesh(self) -> CoordinatorMesh:
        """Our ROUTER, on the advertised address: in --port-range when given (a firewall admits it), else ephemeral."""
        d = self.d
        port: int | str = "*"
        if d.cfg.port_range is not None:
            low, high = d.cfg.port_range
            # A free port first: a bind that fails names the whole range in its error, not one port.
            port = next((p for p in range(low, high + 1) if PortPool(d.host).free(p)), 0)
            if not port:
                raise StartError(f"no free port for the mesh in --port-range {low}-{high} on {d.host}")
        return CoordinatorMesh(d.ctx, f"tcp://{d.host}:{port}", d.cfg.node_id, d.keys)

    # ---- start and stop ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        try:
            self.elector.start()
        except (EtcdUnavailable, EtcdClusterChanged) as exc:
            raise StartError(f"--rdzv-backend etcd: {exc}") from None
        except Exception as exc:  # a refused request (auth, a proxy that is not etcd): one line, exit 2
            raise StartError(f"--rdzv-backend etcd: etcd refused us: {str(exc).splitlines()[0][:200]}") from None
        log.info("[%s] etcd: cluster %s; mesh %s", self.d.cfg.node_id, self.client.cluster_id, self.endpoint)

    def close(self) -> None:
        """Our last state change written, then the lease revoked: the next daemon takes over at once."""
        if self.store is not None:
            self.store.close()
        self.elector.resign()
        if self.serving is not None:
            self.serving.cancel()
        self.mesh.close()

    def threadsafe(self, handler: Any) -> Any:
        def call(arg: Any) -> None:
            if self.loop is not None and not self.loop.is_closed():
                self.loop.call_soon_threadsafe(handler, arg)
        return call

    # ---- what the election says ---------------------------------------------------------------------------
    def on_leader(self, leader: Leader | None) -> None:
        self.leader = leader
        if self.d.node.state == NodeState.ending:
            return  # this daemon is on its way out: it follows nobody any more
        if leader is None:  # our lease is gone: whatever we were, we are not the coordinator now
            self.step_down("our etcd lease expired")
            return
        self.epoch = max(self.epoch, leader.epoch)
        if leader.key == self.elector.key:
            if self.d.coordinator is None:
                self.take_over(leader)
            return
        self.step_down(f"node {leader.node_id} leads (epoch {leader.epoch})")
        self.follow(leader)

    def on_health(self, health: EtcdHealth) -> None:
        self.health = health
        cfg = self.d.cfg
        if health.ok:
            log.warning("[%s] etcd is reachable again: membership changes resume", cfg.node_id)
        else:
            log.warning("[%s] etcd unreachable (%s): membership is frozen; training goes on in the current world; "
                        "the job stops if this lasts %.0fs", cfg.node_id, health.detail, cfg.etcd_outage_s)
        c = self.d.coordinator
        if c is not None:
            kind = EventKind.etcd_restored if health.ok else EventKind.etcd_unreachable
            c.emit(kind, detail=health.detail, outage_limit_s=cfg.etcd_outage_s)

    def on_fatal(self, message: str) -> None:
        self.d.exit_message = f"--rdzv-backend etcd: {message}"
        self.d.spawn(self.d.finish(JobState.failed, message, 2))

    # ---- coordinator role ----------------------------------------------------------------------------------
    def take_over(self, leader: Leader) -> None:
        d, now = self.d, time.time()
        try:
            snap = Snapshot.read(self.client, self.prefix)
        except (EtcdUnavailable, EtcdClusterChanged) as exc:
            log.warning("[%s] etcd: cannot read the job's state to take over (%s); retrying", d.cfg.node_id, exc)
            self.rebuild = True
            return
        fresh = snap.job.get("state") in ENDED  # a finished job of the same id: this is a new run
        if fresh:
            snap = Snapshot(alive=snap.alive)
        reset_events(d.events, snap.events)
        store = EtcdStore(self.client, self.prefix, leader.key, leader.epoch, event_capacity=d.events.capacity,
                          snapshot=snap, fresh=fresh)
        self.mesh.forget()  # only daemons that register with us now are routes
        c = Coordinator(d.cfg, store, self.send, d.events, d.on_job_event, connected=self.mesh.connected,
                        backlog=self.mesh.backlog, send_all=self.send_all)
        self.mesh.relay_of = c.relays.via_of
        c.status_extra = self.status_extra
        store.job_state = lambda: job_record(c)
        store.events_since = lambda seq: d.events.query(since_seq=seq, limit=0)
        restore(c, snap, now)
        self.store, self.rebuild, self.held = store, False, []
        d.coordinator, d.coord_mesh = c, self.mesh
        d.member.is_coordinator = True
        if d.member_mesh is not None:
            d.member_mesh.close()
            d.member_mesh, self.member_endpoint = None, ""
        self.serving = asyncio.create_task(self.mesh.serve(d.on_peer, d.on_connection_closed))
        if not d.cfg.no_python:  # in-place resizes need the job's store on the coordinator's node: ours now
            c.resizer.store_pending = True
            d.spawn(d.start_job_store(c))
        previous_node = snap.job.get("coordinator", "")
        c.emit(EventKind.coordinator_elected, epoch=leader.epoch, previous=previous_node,
               restored_round=c.round.round_id if c.round else 0)
        if d.member.registered:
            d.member.last_coord = now
        elif d.member.first_register:
            d.member.register()

    def step_down(self, why: str) -> None:
        d = self.d
        c = d.coordinator
        if c is None:
            return
        log.warning("[%s] no longer the coordinator: %s; following the new one as a member", d.cfg.node_id, why)
        d.coordinator, d.coord_mesh = None, None
        d.member.is_coordinator = False
        if self.store is not None:
            self.store.deposed = True  # nothing more of ours reaches etcd
            self.store.close(0.0)
            self.store = None
        if self.serving is not None:
            self.serving.cancel()
            self.serving = None
        self.held = []
        if d.member.registered:  # our node was registered with us: with the new coordinator it registers again
            d.member.registered = False

    # ---- member role --------------------------------------------------------------------------------------
    def follow(self, leader: Leader) -> None:
        """Point the DEALER at the leader and register with it (the same instance: a takeover costs no round)."""
        d = self.d
        if leader.endpoint != self.member_endpoint or d.member_mesh is None:
            if d.member_mesh is not None:
                d.member_mesh.close()
            d.member_mesh = mesh = d.new_member_mesh(leader.endpoint)
            mesh.on_coordinator_down = lambda: self.coordinator_link_down(mesh)
            self.member_endpoint = leader.endpoint
            d.spawn(self.serve_member(d.member_mesh))
        m, now = d.member, time.time()
        m.registered, m.last_coord = False, now
        if m.first_register:
            m.first_register = now  # --connect-timeout counts from here
            m.register()
        else:
            d.to_coord(MeshOp.announce, {})  # still warming up: the first round waits for us

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
        if not await refuses_connections(leader.endpoint):
            log.info("[%s] coordinator %s's link dropped but %s does not refuse connections (frozen, or the network "
                     "is cut): its lease decides", self.d.cfg.node_id, leader.node_id, leader.endpoint)
            return
        log.warning("[%s] coordinator %s's daemon is gone (%s refuses connections): revoking its etcd lease so the "
                    "next daemon takes over now", self.d.cfg.node_id, leader.node_id, leader.endpoint)
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.client.revoke, lease_of(leader))
        except Exception as exc:  # revoked by another member already, or etcd away: its lease still expires
            log.info("[%s] etcd: revoking coordinator %s's lease: %s", self.d.cfg.node_id, leader.node_id, exc)

    async def serve_member(self, mesh: MemberMesh) -> None:
        with contextlib.suppress(zmq.ZMQError, asyncio.CancelledError):  # closed by a re-point
            await mesh.serve(lambda _sender, env: self.from_coordinator(mesh, env))

    def from_coordinator(self, mesh: MemberMesh, env: Envelope) -> None:
        if mesh is not self.d.member_mesh:
            return  # the DEALER of a coordinator we no longer follow
        if env.type == "rep":  # the answer to an operator request we forwarded: not a decision
            self.d.member.receive(env)
            return
        epoch = env.body.get("epoch", 0)
        if not isinstance(epoch, int) or epoch < self.epoch:
            log.debug("mesh: %s of epoch %r dropped (current %d)", env.op, epoch, self.epoch)
            return  # a deposed coordinator's word (fencing on the mesh)
        self.epoch = epoch
        self.d.member.receive(env)

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
        if self.elector.may_act():
            c.receive(sender, env, time.time())
        elif env.op == MeshOp.hb:  # no decision, no answer; `status` and the console still see who is alive
            c.heartbeat(sender, env.body, time.time())
        elif len(self.held) < HELD_FRAMES:
            self.held.append((sender, env))

    def tick(self, now: float) -> None:
        d, c = self.d, self.d.coordinator
        if not self.health.ok and now - self.health.since > d.cfg.etcd_outage_s:
            self.outage_ends_job(now)
            return
        if self.rebuild and self.leader is not None and self.leader.key == self.elector.key:
            if self.store is not None:  # what it still had queued must not land after the state is re-read
                self.store.deposed = True
                self.store.close(0.0)
                self.store = None
            d.coordinator = None
            self.take_over(self.leader)
            return
        if c is None or self.store is None:
            return
        if self.store.deposed:
            self.step_down("a fenced write failed")
            return
        me = c.nodes.get(d.cfg.node_id)
        if me is not None and me.status != NodeStatus.alive:
            return  # we handed over (SIGTERM): the round without us is the next coordinator's
        if not self.elector.may_act():
            if not self.frozen_logged:
                self.frozen_logged = True
                log.warning("[%s] coordinator: our etcd lease is not confirmed; no decisions until it is",
                            d.cfg.node_id)
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
            log.warning("[%s] coordinator: %s; rebuilding from etcd before any other decision", d.cfg.node_id, exc)
            self.rebuild = True
            return
        if now - self.last_sync >= SYNC_EVERY_S:
            self.last_sync = now
            self.store.sync()

    def outage_ends_job(self, now: float) -> None:
        d = self.d
        if self.ending:
            return
        self.ending = True
        reason = (f"etcd unreachable for {now - self.health.since:.0f}s (--rdzv-conf etcd_outage_timeout="
                  f"{d.cfg.etcd_outage_s:g}): the job stops")
        c = d.coordinator
        if c is not None and c.state not in ENDED:
            c.end(JobState.failed, reason, now)
        d.spawn(d.finish(JobState.failed, reason, 1, reason))

    # ---- signals -------------------------------------------------------------------------------------------
    def leave(self, reason: str) -> bool:
        """SIGTERM on the coordinator's daemon: its node drains like any member's, then it hands over.

        Returns False when this daemon is not the coordinator (the member's own leave applies).
        """
        d, c = self.d, self.d.coordinator
        if c is None:
            return False
        me, m = d.cfg.node_id, d.member
        rnd = c.round
        if m.leaving or c.state != JobState.running or rnd is None or not rnd.has(me):
            m.depart(f"{reason}; handing the coordinator role over")  # `leave` to ourselves: left now, then exit
            return True
        m.leaving = True
        log.info("[%s] leaving gracefully (%s); the coordinator role goes to the next daemon", me, reason)
        if c.transition is None:
            c.begin_transition(TransitionKind.drain, [me], Role.standby, After.round,
                               f"node {me} leaving: {reason} (coordinator handover)", hold=SIGNAL_WINDOW_S)
        c.fold_departing(me, reason)  # with the members' leaves in flight (a job-wide signal): one agreed step
        d.spawn(m.depart_after_grace(reason))
        return True

    # ---- reading -------------------------------------------------------------------------------------------
    def status_extra(self) -> dict[str, Any]:
        health, now = self.health, time.time()
        extra: dict[str, Any] = {
            "rdzv_backend": "etcd", "epoch": self.leader.epoch if self.leader else 0,
            "etcd": {"ok": health.ok, "since": health.since, "detail": health.detail,
                     "endpoints": [f"{h}:{p}" for h, p in self.d.cfg.etcd_endpoints],
                     "outage_limit_s": self.d.cfg.etcd_outage_s}}
        if not health.ok:
            extra["reason"] = (f"etcd unreachable for {now - health.since:.0f}s: membership frozen, training goes on "
                               f"in the current world; the job stops after {self.d.cfg.etcd_outage_s:g}s")
        return extra


def reset_events(events: EventLog, stored: list[dict[str, Any]]) -> None:
    """The job's log as etcd holds it: a new coordinator numbers on from there, with no gap."""
    events.clear()
    for event in stored:
        events.adopt(event)


def job_record(c: Coordinator) -> dict[str, Any]:
    return {"target": c.target, "restarts": dict(c.restarts), "used_ports": sorted(c.used_ports),
            "state": c.state, "reason": c.reason, "join_seq": c.join_seq, "coordinator": c.cfg.node_id}


def restore(c: Coordinator, snap: Snapshot, now: float) -> None:
    """Rebuild the coordinator from etcd; every live member gets a grace to find us; the dead are lost now."""
    job = snap.job
    if job:
        c.target = int(job["target"])
        c.restarts = {Cause(k): int(v) for k, v in job["restarts"].items()}
        c.used_ports = set(job["used_ports"])
        c.join_seq = int(job["join_seq"])
        c.state, c.reason = JobState(job["state"]), str(job["reason"])
    c.round = snap.rounds[-1] if snap.rounds else None
    me = c.cfg.node_id
    c.relays.rebuild(c.alive())
    c.replace_relay(me, now)  # we coordinate now: a group we relayed for moves behind the next of its members
    c.relays.direct(me)
    if me in c.nodes:
        c.nodes[me].via = ""
    for node in c.alive():
        node.last_seen = now + TAKEOVER_GRACE_S
    for node in c.alive():
        if node.node_id != me and snap.alive.get(node.node_id) != node.instance:
            c.remove(node.node_id, NodeStatus.lost, f"node {node.node_id}'s etcd lease expired", now)
    rnd = c.round
    if rnd is not None and c.state == JobState.running and c.pending is None:
        if c.round_lost_a_member():
            gone = sorted(n for n in rnd.node_ids() if c.nodes[n].status != NodeStatus.alive)
            c.schedule(Cause.membership, f"node(s) {', '.join(gone)} gone (coordinator takeover)", now)
        elif "go" not in rnd.timeline:  # the last coordinator went before releasing its round: form it again
            c.schedule(Cause.membership, f"round {rnd.round_id} was forming at the takeover", now)
