"""One elasticd process: wires the node agent, the coordinator role, the mesh and the operator sockets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from elasticd import __version__, steer, step_agreement
from elasticd.auth import Gatekeeper, KeyStore, KeyStoreError, NodeKeys
from elasticd.config import JobConfig, StartError
from elasticd.control import ControlPlane
from elasticd.coordinator import Coordinator
from elasticd.events import EventLog
from elasticd.membership import MemoryStore
from elasticd.mesh import CoordinatorMesh, MemberMesh
from elasticd.node import NodeAgent
from elasticd.peer_ops import handle_coordinator_message, handle_peer, leave_job
from elasticd.protocol import Envelope
from elasticd.runtime import advertised_addr, is_local_host, remove_endpoints, write_endpoints
from elasticd.spawner import Spawner, Zygote
from elasticd.worker_channel import WorkerChannel
from elasticd.workers import base_env

log = logging.getLogger("elasticd")
EXIT_COORDINATOR_LOST = 3
ZYGOTE_WARMUP_S = 60.0  # past this, register anyway: workers are then exec'd cold


class Daemon:
    def __init__(self, cfg: JobConfig, connect_timeout_s: float = 60.0) -> None:
        self.cfg = cfg
        self.ctx = zmq.asyncio.Context()
        self.events = EventLog()
        self.host = advertised_addr(cfg.rdzv_host, cfg.local_addr)
        self.connect_timeout_s = connect_timeout_s
        self.coordinator: Coordinator | None = None
        self.coord_mesh: CoordinatorMesh | None = None
        self.member_mesh: MemberMesh | None = None
        self.node = NodeAgent(cfg, self.host, self.to_coord, self.node_event, {})
        self.registered = False
        self.started = time.time()
        self.last_coord = 0.0
        self.last_register = 0.0
        self.first_register = 0.0  # 0 until the zygote is warm and the first `register` went out
        self.duplicate_since = 0.0
        self.done = asyncio.Event()
        self.exit_message = ""
        self.tasks: list[asyncio.Task[Any]] = []
        self.endpoints: dict[str, str] = {}
        self.plane: ControlPlane | None = None  # the operator sockets, bound in start()
        self.channel = WorkerChannel(self.ctx, cfg, self.node)
        self.zygote: Zygote | None = None
        self.keys: NodeKeys | None = None
        self.gate: Gatekeeper | None = None

    # ---- set-up ------------------------------------------------------------------------------
    def bind_mesh(self) -> None:
        endpoint = f"tcp://{self.cfg.rdzv_host}:{self.cfg.rdzv_port}"
        if is_local_host(self.cfg.rdzv_host):
            try:
                addr = socket.gethostbyname(self.cfg.rdzv_host)
                self.coord_mesh = CoordinatorMesh(self.ctx, f"tcp://{addr}:{self.cfg.rdzv_port}", self.cfg.node_id,
                                                  self.keys)
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE:
                    raise StartError(f"cannot bind rendezvous endpoint {endpoint}: {exc}") from None
        if self.coord_mesh is not None:
            self.coordinator = Coordinator(self.cfg, MemoryStore(), self.send_to_node, self.events,
                                           self.on_job_event)
            self.coordinator.reform_first = steer.reform_first
        else:
            self.member_mesh = MemberMesh(self.ctx, endpoint, self.cfg.node_id, self.node.instance, self.keys)

    async def start(self) -> None:
        if self.cfg.keys_dir:
            store = KeyStore(Path(self.cfg.keys_dir))
            try:
                self.keys = store.node_keys()
            except KeyStoreError as err:
                raise StartError(str(err)) from None
            self.gate = Gatekeeper(self.ctx, store)
            self.gate.start()
        self.bind_mesh()
        self.plane = ControlPlane(self)
        self.endpoints = self.plane.bind()
        self.node.endpoints = {"control": self.endpoints["control"], "pub": self.endpoints["pub"]}
        self.node.worker_env = self.channel.bind()
        if self.cfg.zygote:
            self.zygote = Zygote(self.cfg.python or sys.executable, self.cfg.preload, base_env(self.cfg))
            await self.zygote.start()
            self.node.spawner = Spawner(self.cfg.python, self.zygote)
        write_endpoints(self.cfg.job_id, self.cfg.node_id, {
            "job_id": self.cfg.job_id, "node_id": self.cfg.node_id, "pid": os.getpid(), "host": self.host,
            "coordinator": self.coordinator is not None, "version": __version__, **self.endpoints,
            "server_key": self.keys.public.decode() if self.keys else ""})
        role = "coordinator" if self.coordinator else "member"
        print(f"elasticd {__version__}: node {self.cfg.node_id} ({role}) of job {self.cfg.job_id}; "
              f"control {self.endpoints['control']} pub {self.endpoints['pub']}; "
              f"logs {os.path.join(self.cfg.log_dir, self.cfg.job_id, self.cfg.node_id)}", file=sys.stderr,
              flush=True)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, self.on_signal, sig)
        mesh_task = (self.coord_mesh.serve(self.on_peer) if self.coord_mesh
                     else self.member_mesh.serve(self.on_coordinator_message))  # type: ignore[union-attr]
        self.tasks = [asyncio.create_task(mesh_task), asyncio.create_task(self.tick_loop()),
                      asyncio.create_task(self.channel.serve()), *self.plane.tasks()]
        self.spawn(self.register_when_warm())

    async def register_when_warm(self) -> None:
        """Join only once workers can start at once: the job keeps training while our zygote imports torch."""
        if self.zygote is not None:
            self.to_coord("announce", {})  # the first round waits for us rather than forming without us
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.zygote.ready.wait(), ZYGOTE_WARMUP_S)
        self.first_register = time.time()
        self.register()

    async def run(self) -> int:
        try:
            await self.start()
            await self.done.wait()
        finally:
            await self.shutdown()
        if self.exit_message:
            print(f"elasticd: {self.exit_message}", file=sys.stderr, flush=True)
        return self.node.exit_code if self.node.exit_code is not None else 1

    async def shutdown(self) -> None:
        await self.node.stop_workers()
        if self.zygote is not None:
            await self.zygote.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.plane is not None:
            self.plane.close()
        self.channel.close()
        for mesh in (self.coord_mesh, self.member_mesh):
            if mesh is not None:
                mesh.close()
        if self.gate is not None:
            self.gate.stop()
        self.ctx.term()
        remove_endpoints(self.cfg.job_id, self.cfg.node_id, os.getpid())

    # ---- messages to and from the coordinator --------------------------------------------------
    def to_coord(self, op: str, body: dict[str, Any]) -> None:
        if self.coordinator is not None:
            self.on_peer(self.cfg.node_id, Envelope("req", op, body, node=self.cfg.node_id, ts=time.time()))
        elif self.member_mesh is not None:
            self.member_mesh.send(op, body)

    def send_to_node(self, node_id: str, op: str, body: dict[str, Any]) -> None:
        if node_id == self.cfg.node_id:
            self.on_coordinator_message(node_id, Envelope("req", op, body, node=node_id, ts=time.time()))
        elif self.coord_mesh is not None:
            self.coord_mesh.send(node_id, op, body)

    def register(self) -> None:
        self.last_register = time.time()
        self.to_coord("register", self.node.register_body())

    def on_peer(self, sender: str, env: Envelope) -> None:
        assert self.coordinator is not None
        handle_peer(self, sender, env)

    def on_coordinator_message(self, sender: str, env: Envelope) -> None:
        self.last_coord = time.time()
        handle_coordinator_message(self, env)

    # ---- events -------------------------------------------------------------------------------
    def node_event(self, kind: str, **fields: Any) -> None:
        self.to_coord("event", {"kind": kind, "node": self.cfg.node_id, "ts": time.time(), **fields})

    def on_job_event(self, event: dict[str, Any]) -> None:
        """The coordinator numbered an event: publish it here and fan it out to every member."""
        self.publish_event(event)
        if self.coordinator is not None and self.coord_mesh is not None:
            for node in self.coordinator.alive():
                if node.node_id != self.cfg.node_id:
                    self.coord_mesh.send(node.node_id, "event", event, kind="ev")

    def publish_event(self, event: dict[str, Any]) -> None:
        if self.plane is not None:
            self.plane.publish_event(event)

    # ---- time and signals -------------------------------------------------------------------------
    async def tick_loop(self) -> None:
        next_beat = 0.0
        while not self.done.is_set():
            now = time.time()
            try:
                if self.coordinator is not None:
                    self.coordinator.tick(now)
                    steer.finish_if_ready(self.coordinator, now)
                    step_agreement.expire(self.coordinator, now)
                if self.plane is not None:
                    self.plane.publish_steps(now)
                if now >= next_beat:
                    next_beat = now + self.cfg.heartbeat_s
                    self.beat(now)
            except Exception:  # a bug in one tick must not freeze membership for the whole job
                log.exception("[%s] tick failed", self.cfg.node_id)
            await asyncio.sleep(0.05)

    def beat(self, now: float) -> None:
        if self.gate is not None:
            self.gate.reload()
        if self.plane is not None:
            self.plane.heartbeat()
        self.channel.check_hangs(now)
        if not self.registered:
            if not self.first_register:
                return  # still warming up
            if now - self.first_register > self.connect_timeout_s:
                self.fail_start(f"rendezvous endpoint {self.cfg.rdzv_host}:{self.cfg.rdzv_port} did not answer "
                                f"within {self.connect_timeout_s:.0f}s; is the first elasticd of job "
                                f"'{self.cfg.job_id}' running on that host?")
            elif now - self.last_register >= 1.0:
                self.register()
            return
        self.to_coord("hb", self.node.heartbeat_body())
        if self.coordinator is None and now - self.last_coord > self.cfg.lost_after_s:
            self.exit_message = (f"coordinator of job '{self.cfg.job_id}' at {self.cfg.rdzv_host}:"
                                 f"{self.cfg.rdzv_port} stopped answering for {self.cfg.lost_after_s:.0f}s; "
                                 "the job cannot go on without it (no coordinator HA yet): workers stopped")
            self.spawn(self.finish("lost", self.exit_message, EXIT_COORDINATOR_LOST))

    def fail_start(self, message: str) -> None:
        self.exit_message = message
        self.node.exit_code = 2
        self.done.set()

    def on_signal(self, sig: int) -> None:
        log.info("[%s] received %s", self.cfg.node_id, signal.Signals(sig).name)
        leave_job(self, f"node {self.cfg.node_id}'s elasticd received {signal.Signals(sig).name}")

    async def finish(self, state: str, reason: str, code: int | None = None) -> None:
        if self.node.state == "ending":
            return
        await self.node.end(state, reason)
        if code is not None:
            self.node.exit_code = code
        if not self.exit_message:
            self.exit_message = f"job '{self.cfg.job_id}' {state}: {reason}"
        if self.coordinator is not None:
            await asyncio.sleep(0.3)  # let job_end reach the members before the ROUTER closes
        self.done.set()

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.append(task)
        task.add_done_callback(lambda t: t.cancelled() or t.exception() is None
                               or log.error("task failed: %r", t.exception()))

