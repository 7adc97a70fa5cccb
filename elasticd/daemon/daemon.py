"""One elasticd process: wires the node agent, the coordinator role, the mesh and the operator sockets."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Coroutine
from pathlib import Path

import zmq
import zmq.asyncio

from elasticd import __version__
from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.membership import MemoryStore
from elasticd.daemon.alerts import Alerts
from elasticd.daemon.control import ControlPlane
from elasticd.daemon.current_link import CurrentLink
from elasticd.daemon.etcd_session import etcd_client
from elasticd.daemon.exporter import MetricsExporter, bind_host_of
from elasticd.daemon.failover import Failover, candidate_mesh
from elasticd.daemon.leaving import Leave
from elasticd.daemon.node_queries import NodeQueries
from elasticd.daemon.worker_services import WorkerServices
from elasticd.job.config import JobConfig, StartError
from elasticd.job.events import EventLog
from elasticd.job.runtime import advertised_addr, is_local_host, remove_endpoints, socket_ifname_env, write_endpoints
from elasticd.keys.auth import Gatekeeper, KeyStore, KeyStoreError, NodeKeys
from elasticd.member.agent import NodeAgent
from elasticd.member.health import HealthMonitor
from elasticd.member.link import Member
from elasticd.member.worker_channel import WorkerChannel
from elasticd.mesh.coordinator_mesh import CoordinatorMesh
from elasticd.mesh.member_mesh import MemberMesh
from elasticd.mesh.relay import Relay
from elasticd.wire.member_state import EventReport
from elasticd.wire.names import CTL_PREFIX, EventKind, JobState, MeshOp, NodeState, NodeStatus
from elasticd.wire.protocol import Envelope, Json, JsonObject

log = logging.getLogger("elasticd")
TICK_S = 0.05  # the loop's period, or less to a pending round's due (PendingRound.wake_in)


class Daemon:
    """The composition root: builds the parts, owns the loop and the signals, hands each part what it needs."""

    def __init__(self, cfg: JobConfig, connect_timeout_s: float = 60.0) -> None:
        self.cfg = cfg
        self.ctx = zmq.asyncio.Context()
        self.events = EventLog(EventLog.capacity_for(cfg.max_nodes))
        self.host = advertised_addr(cfg.rdzv_host, cfg.local_addr)
        self.connect_timeout_s = connect_timeout_s
        self.coordinator: Coordinator | None = None
        self.coord_mesh: CoordinatorMesh | None = None
        self.member_mesh: MemberMesh | None = None
        self.node = NodeAgent(cfg, self.host, self.to_coord, self.node_event, {})
        self.started = time.time()
        self.done = asyncio.Event()
        self.exit_message = ""
        self.exit_code: int | None = None  # set when the daemon should exit
        self.leave = Leave(self)  # what a leave signal does, by the role we hold
        self.tasks: list[asyncio.Task[object]] = []
        self.endpoints: dict[str, str] = {}
        self.plane: ControlPlane | None = None  # the operator sockets, bound in start()
        self.channel = WorkerChannel(self.ctx, cfg, self.node)
        self.queries = NodeQueries(cfg.node_id, self.node.output, self.send_to_node, self.to_coord, self.status_of,
                                   lambda: self.coordinator is not None, self.spawn)
        self.member = Member(cfg, self.node, self.channel, self.to_coord, self, self.events, self.publish_event,
                             self.on_forwarded_reply, connect_timeout_s, is_coordinator=False, link=CurrentLink(self),
                             on_node_query=self.queries.on_query)
        self.health = HealthMonitor(cfg, lambda r: self.to_coord(MeshOp.health, r.encode()),
                                    lambda: self.member.registered, self.node.rank_reports.checkpoint_folders)
        self.keys: NodeKeys | None = None
        self.gate: Gatekeeper | None = None
        self.services = WorkerServices(cfg, self.ctx, self.host, self.node)
        self.exporter: MetricsExporter | None = None  # --metrics-port
        self.failover: Failover | None = None  # --rdzv-backend etcd: the coordinator is elected (failover.py)
        self.relay: Relay | None = None  # in a job with relays: where this node relays for others when told to
        self.alerts = Alerts(cfg.on_event, cfg.job_id)  # --on-event, on the events this daemon's coordinator numbers

    # ---- set-up ------------------------------------------------------------------------------
    def bind_mesh(self) -> None:
        if self.cfg.etcd_endpoints:  # every daemon is equal: none binds the rendezvous endpoint
            client = etcd_client(self.cfg)  # without python-etcd, a start error before any socket is bound
            mesh = candidate_mesh(self.cfg, self.ctx, self.host, self.keys)
            self.failover = Failover(self.cfg, client, mesh, self.node, self.events, self)
            self.failover.start()  # etcd unreachable or another cluster: a start error (exit 2)
            return
        endpoint = f"tcp://{self.cfg.rdzv_host}:{self.cfg.rdzv_port}"
        if self.cfg.host_coordinator and is_local_host(self.cfg.rdzv_host):
            try:
                addr = socket.gethostbyname(self.cfg.rdzv_host)
                self.coord_mesh = CoordinatorMesh(self.ctx, f"tcp://{addr}:{self.cfg.rdzv_port}", self.cfg.node_id,
                                                  self.keys)
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE:
                    raise StartError(f"cannot bind rendezvous endpoint {endpoint}: {exc}") from None
        if self.coord_mesh is not None:
            self.coordinator = Coordinator(self.cfg, MemoryStore(), self.send_to_node, self.events,
                                           self.on_job_event, connected=self.coord_mesh.connected,
                                           backlog=self.coord_mesh.backlog, send_all=self.send_to_nodes)
            self.coord_mesh.route_by(self.coordinator.relays.via_of)
            self.member.coordinator_here(time.time())
        else:
            self.member_mesh = self.new_member_mesh(endpoint)

    def new_member_mesh(self, endpoint: str) -> MemberMesh:
        """Our link to the coordinator at `endpoint`; a relay's batches from it go to our relay."""
        mesh = MemberMesh(self.ctx, endpoint, self.cfg.node_id, self.node.instance, self.keys)
        mesh.on_switched = lambda: self.member.speak(time.time())
        if self.relay is not None:
            mesh.on_batch = self.relay.deliver
        return mesh

    def bind_relay(self) -> None:
        """Every daemon of a job with relays can be told to relay (the embedded coordinator's node never is)."""
        if self.cfg.relay_size and self.coordinator is None:
            self.relay = Relay(self.ctx, self.host, self.keys, self.cfg.port_range, self.to_coordinator_as_relay)
            if self.member_mesh is not None:
                self.member_mesh.on_batch = self.relay.deliver

    def to_coordinator_as_relay(self, parts: list[bytes]) -> bool:
        """Our relay's batch goes up our own link (a relay is never relayed itself)."""
        mesh = self.member_mesh
        return mesh is not None and self.member.registered and mesh.send_parts(parts)

    async def start(self) -> None:
        self.load_keys()
        self.bind_mesh()
        self.bind_relay()
        self.plane = ControlPlane(self)
        self.endpoints = self.plane.bind()
        advertised = {"control": self.endpoints["control"], "pub": self.endpoints["pub"],
                      **({"relay": self.relay.endpoint} if self.relay else {}),
                      **({"store_tunnel": self.services.bind_tunnel(self.keys)} if self.keys is not None else {})}
        if self.cfg.metrics_port is not None:  # the scrape endpoint is exactly as reachable as the control socket
            self.exporter = MetricsExporter(self, bind_host_of(self.endpoints["control"]), self.cfg.metrics_port)
        # Multi-host gloo/NCCL out of the box: workers bind the interface we advertise, unless the user named one.
        socket_env, socket_note = socket_ifname_env(self.host, {**os.environ, **self.cfg.env})
        log.info("%s", socket_note)  # `elasticd start` logs INFO to stderr: one line by the startup line
        self.node.bound(advertised, {**socket_env, **self.channel.bind()})
        await self.services.start(self.keys)
        self.announce()
        loop = asyncio.get_running_loop()
        for name in self.cfg.leave_signals:  # --signals-to-handle
            loop.add_signal_handler(signal.Signals[name], self.leave.on_signal, signal.Signals[name])
        self.tasks += [asyncio.create_task(c) for c in (self.tick_loop(), self.channel.serve(), self.health.run())]
        self.tasks += self.plane.tasks()
        if self.coord_mesh is not None and self.failover is None:  # with etcd, the election's role serves the mesh
            self.tasks.append(asyncio.create_task(self.coord_mesh.serve(self.on_peer, self.on_connection_closed)))
        elif self.member_mesh is not None and self.failover is None:
            self.tasks.append(asyncio.create_task(self.member_mesh.serve(lambda _s, env: self.to_member(env))))
        self.tasks += self.services.tasks()
        if self.relay is not None:
            self.tasks.append(asyncio.create_task(self.relay.serve()))
        if self.coordinator is not None:
            self.services.host_job_store(self.coordinator, self.spawn)
        self.spawn(self.register_when_warm())

    def load_keys(self) -> None:
        """--keys: our CURVE keys, and the gate that admits the keys listed (refused connections become events)."""
        if self.cfg.keys_dir:
            store = KeyStore(Path(self.cfg.keys_dir))
            try:
                self.keys = store.node_keys()
            except KeyStoreError as err:
                raise StartError(str(err)) from None
            self.gate = Gatekeeper(self.ctx, store, self.node_event)
            self.gate.start()

    def announce(self) -> None:
        """Our endpoints file (the CLI finds us by it), then the startup line."""
        write_endpoints(self.cfg.job_id, self.cfg.node_id, {
            "job_id": self.cfg.job_id, "node_id": self.cfg.node_id, "pid": os.getpid(), "host": self.host,
            "coordinator": self.coordinator is not None, "version": __version__, **self.endpoints,
            "server_key": self.keys.public.decode() if self.keys else ""})
        role = "coordinator" if self.coordinator else "candidate" if self.failover else "member"
        metrics = f"metrics {self.exporter.url}; " if self.exporter else ""
        print(f"elasticd {__version__}: node {self.cfg.node_id} ({role}) of job {self.cfg.job_id}; "
              f"control {self.endpoints['control']} pub {self.endpoints['pub']}; {metrics}"
              f"logs {os.path.join(self.cfg.log_dir, self.cfg.job_id, self.cfg.node_id)}", file=sys.stderr,
              flush=True)

    async def register_when_warm(self) -> None:
        """Join only once workers can start at once: the job keeps training while our zygote imports torch."""
        if self.services.zygote is not None:
            self.to_coord(MeshOp.announce, {})  # the first round waits for us rather than forming without us
            await self.services.warm()
        self.member.start_registering()

    async def run(self) -> int:
        try:
            await self.start()
            await self.done.wait()
        finally:
            await self.shutdown()
        if self.exit_message:
            print(f"elasticd: {self.exit_message}", file=sys.stderr, flush=True)
        return self.exit_code if self.exit_code is not None else 1

    async def shutdown(self) -> None:
        await self.node.stop_workers()
        await self.services.stop()
        await self.alerts.finish()  # the job's end is an event an operator may page on
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for part in (self.plane, self.exporter, self.channel, self.services, self.relay):
            if part is not None:
                part.close()
        if self.failover is not None:  # after our workers stopped: resigning lets the next daemon take over now
            self.failover.close()
            self.coord_mesh = None
        for mesh in (self.coord_mesh, self.member_mesh):
            if mesh is not None:
                mesh.close()
        if self.gate is not None:
            self.gate.stop()
        self.ctx.term()
        remove_endpoints(self.cfg.job_id, self.cfg.node_id, os.getpid())

    # ---- messages between this node, the coordinator and the members -------------------------------
    def to_coord(self, op: MeshOp, body: JsonObject) -> None:
        if self.coordinator is not None:
            self.on_peer(self.cfg.node_id, Envelope("req", op, body, node=self.cfg.node_id, ts=time.time()))
        elif self.member_mesh is not None:
            self.member_mesh.send(op, body)

    def send_to_node(self, node_id: str, op: MeshOp, body: JsonObject) -> None:
        if node_id == self.cfg.node_id:
            self.to_member(Envelope("req", op, body, node=node_id, ts=time.time()))
        elif self.coord_mesh is not None:
            self.coord_mesh.send(node_id, op, body)

    def send_to_nodes(self, node_ids: list[str], op: MeshOp, body: JsonObject) -> None:
        """One message to many nodes: encoded once for the members, handed as is to our own node."""
        if self.coord_mesh is not None:
            self.coord_mesh.send_all([n for n in node_ids if n != self.cfg.node_id], op, body)
        if self.cfg.node_id in node_ids:
            self.send_to_node(self.cfg.node_id, op, dict(body))

    def on_peer(self, sender: str, env: Envelope) -> None:
        """Coordinator side: a forwarded operator request goes to the control plane, the rest to the coordinator."""
        if env.type in ("req", "rep") and env.op.startswith(CTL_PREFIX):
            if self.plane is not None:
                self.plane.on_forwarded(sender, env)
        elif env.op == MeshOp.node_answer:
            self.queries.on_answer(sender, env)
        elif self.failover is not None:
            self.failover.receive(sender, env)  # fenced: held while our lease is unconfirmed
        elif self.coordinator is not None:
            self.coordinator.receive(sender, env, time.time())

    def to_member(self, env: Envelope) -> None:
        """The coordinator's word (or the answer to a forwarded request) for our own member."""
        self.member.receive(env)

    def status_of(self, node_id: str) -> NodeStatus | None:
        """A node as our coordinator sees it; None when unknown (or we hold no coordinator)."""
        record = self.coordinator.nodes.get(node_id) if self.coordinator is not None else None
        return record.status if record is not None else None

    def on_connection_closed(self, node_id: str) -> None:
        if self.coordinator is not None:
            self.coordinator.connection_lost(node_id, time.time())

    def forward(self, op: str, body: JsonObject, msg_id: str) -> bool:
        """Member side: pass an operator request to the coordinator; False while not connected to it."""
        if not self.member.registered or self.member_mesh is None:
            return False
        self.member_mesh.send(CTL_PREFIX + op, body, kind="req", msg_id=msg_id)
        return True

    def answer_forward(self, node_id: str, op: str, body: JsonObject, msg_id: str) -> None:
        if self.coord_mesh is not None:
            self.coord_mesh.send(node_id, op, body, kind="rep", msg_id=msg_id)

    def on_forwarded_reply(self, env: Envelope) -> None:
        if self.plane is not None:
            self.plane.on_forwarded_reply(env)

    # ---- events -------------------------------------------------------------------------------
    def node_event(self, kind: EventKind, **fields: Json) -> None:
        self.to_coord(MeshOp.event, EventReport(kind, time.time(), fields).encode())

    def steering_held(self) -> str:
        """Why this coordinator may not take a steer verb now ("" when it may): its etcd lease is unconfirmed."""
        if self.failover is not None and not self.failover.etcd.may_act():
            return "this coordinator's etcd lease is not confirmed (etcd unreachable, or a takeover under way)"
        return ""

    def on_job_event(self, event: JsonObject) -> None:
        """The coordinator numbered an event: it is published once, here (members get only what they act on)."""
        self.publish_event(event)
        self.alerts.on_event(event)

    @property
    def events_pub(self) -> str:
        """Where the job's events are published: the coordinator's PUB (a member learns it from its welcome)."""
        return self.endpoints.get("pub", "") if self.coordinator is not None else self.member.events_pub

    def publish_event(self, event: JsonObject) -> None:
        if self.plane is not None:
            self.plane.publish_event(event)

    # ---- time and signals -------------------------------------------------------------------------
    async def tick_loop(self) -> None:
        next_beat = 0.0
        while not self.done.is_set():
            now = time.time()
            try:
                if self.failover is not None:
                    self.failover.tick(now)
                elif self.coordinator is not None:
                    self.coordinator.tick(now)
                if self.plane is not None:
                    self.plane.publish_steps(now)
                self.node.check_recorded()
                if now >= next_beat:
                    next_beat = now + self.cfg.heartbeat_s
                    self.beat(now)
            except Exception:  # a bug in one tick must not freeze membership for the whole job
                log.exception("[%s] tick failed", self.cfg.node_id)
            pending = self.coordinator.pending if self.coordinator is not None else None
            await asyncio.sleep(pending.wake_in(time.time(), TICK_S) if pending else TICK_S)

    def beat(self, now: float) -> None:
        if self.gate is not None:
            self.gate.reload()
        if self.plane is not None:
            self.plane.heartbeat()
        self.channel.check_hangs(now)
        self.member.beat(now)

    def fail(self, reason: str, message: str) -> None:
        """A fatal error past start (etcd's): the job fails here with `reason`; we exit 2 saying `message`."""
        self.exit_message = message
        self.spawn(self.finish(JobState.failed, reason, 2))

    def fail_start(self, message: str) -> None:
        self.exit_message = message
        self.exit_code = 2
        self.done.set()

    async def finish(self, state: str, reason: str, code: int | None = None, message: str = "") -> None:
        if self.node.state == NodeState.ending:
            return
        self.exit_message = self.exit_message or message
        await self.node.end(state, reason)
        self.exit_code = code if code is not None else 0 if state in (JobState.succeeded, JobState.stopped) else 1
        if not self.exit_message:
            self.exit_message = f"job '{self.cfg.job_id}' {state}: {reason}"
        if self.coordinator is not None:
            await asyncio.sleep(0.3)  # let job_end reach the members before the ROUTER closes
        self.done.set()

    def spawn(self, coro: Coroutine[object, object, object]) -> None:
        task = asyncio.create_task(coro)
        self.tasks.append(task)
        task.add_done_callback(log_failure)

    # ---- the roles' seam: failover (--rdzv-backend etcd) changes them only through these -----------------
    def seat_coordinator(self, coordinator: Coordinator, mesh: CoordinatorMesh, now: float) -> None:
        """Elected: `coordinator` serves on `mesh`, our member follows nobody else and, once joined, stays."""
        self.coordinator, self.coord_mesh = coordinator, mesh
        if self.member_mesh is not None:
            self.member_mesh.close()
            self.member_mesh = None
        self.services.host_job_store(coordinator, self.spawn)  # in-place resizes need it on our node now
        self.member.coordinator_here(now)

    def unseat_coordinator(self) -> None:
        """Deposed: our member registers again, with whoever leads now."""
        self.coordinator, self.coord_mesh = None, None
        self.member.coordinator_elsewhere()

    def drop_stale_coordinator(self) -> None:
        """Still elected, but our coordinator's state is not etcd's: nothing reaches it until it is rebuilt."""
        self.coordinator = None

    def repoint_member(self, endpoint: str) -> MemberMesh:
        """Our member's link goes to the coordinator at `endpoint` from now on (the old link closed)."""
        if self.member_mesh is not None:
            self.member_mesh.close()
        self.member_mesh = self.new_member_mesh(endpoint)
        return self.member_mesh

    def rejoin(self, now: float) -> None:
        """Our member registers again, with whoever it follows now (the same instance: a takeover costs no round)."""
        self.member.follow_new_coordinator(now)


def log_failure(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task failed: %r", task.exception())
