"""Simulated member daemons on real sockets: the mesh side of member.py + node.py, without workers.

Each speaks through the daemon's own MemberMesh; in a job with relays each also binds the daemon's own Relay and
offers it when it registers, as a real daemon does, and relays when the coordinator points others at it. The
fleet runs in child processes, as many members each as their cap on open files allows: a member holds about
FDS_PER_MEMBER descriptors (its links, their monitors, its relay and the links to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import random
import resource
import time
from multiprocessing.connection import Connection
from typing import Any

import zmq
import zmq.asyncio

from elasticd.member.agent import event_body
from elasticd.member.beats import BeatDiff
from elasticd.mesh.member_mesh import MemberMesh
from elasticd.mesh.relay import Relay
from elasticd.wire.names import EventKind, MeshOp, NodeState
from elasticd.wire.protocol import Envelope

BEAT_S = 1.0
LOST_AFTER_S = 3 * BEAT_S  # the loss limit: a report older than this and still asked for was lost
MAX_SOCKETS = 65536
LOOP_S = 0.05  # heartbeats go out spread over the second, as independent daemons' would
FDS_PER_MEMBER = 16


def per_process() -> int:
    """Members one child process can hold: the open-file cap it inherits (raised to its hard limit first)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return max(32, (max(soft, hard) - 256) // FDS_PER_MEMBER)


class FakeMember:
    """One node: registers, heartbeats with changes only, and applies each round at once (no workers)."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, node_id: str, nproc: int, index: int,
                 relays: bool) -> None:
        self.node_id, self.nproc = node_id, nproc
        self.instance = os.urandom(6).hex()
        self.mesh = MemberMesh(ctx, endpoint, node_id, self.instance, None)
        self.mesh.on_switched = lambda: self.beat(time.time(), scheduled=False)
        self.relay = Relay(ctx, "127.0.0.1", None, None, self.mesh.send_parts) if relays else None
        if self.relay is not None:
            self.mesh.on_batch = self.relay.deliver
        self.ports = [40000 + 4 * index + i for i in range(4)]  # never bound: nothing of ours listens
        self.beats = BeatDiff()
        self.registered = self.closed = False
        self.welcomed_at = 0.0
        self.state: str = NodeState.registering
        self.round_id = self.assigned = self.go_round = 0
        self.running = False
        self.ranks: list[int] = []
        self.world_size = 0
        self.reports: dict[str, dict[str, Any]] = {}
        self.next_beat = time.time() + random.random() * BEAT_S
        self.tasks: list[asyncio.Task[Any]] = [asyncio.create_task(self.mesh.serve(lambda _s, env: self.on(env)))]
        if self.relay is not None:
            self.tasks.append(asyncio.create_task(self.relay.serve()))

    def send(self, op: str, body: dict[str, Any]) -> None:
        if not self.closed:
            self.mesh.send(op, body)

    def register(self) -> None:
        self.beats.reset()
        self.mesh.route("")  # as member.py: registering is direct
        relay = {"relay": self.relay.endpoint} if self.relay is not None else {}
        self.send(MeshOp.register, {"instance": self.instance, "host": "127.0.0.1", "nproc": self.nproc,
                                    "node_rank": -1, "ports": self.ports, "control": "", "pub": "", **relay})

    def workers(self) -> list[dict[str, Any]]:
        if not self.running:
            return []
        return [{"pid": 100000 + r, "local_rank": i, "rank": r, "state": "running", "exit_code": None,
                 "cpu_percent": 99.0, "rss": 1 << 30, "uptime_s": 1.0, "log": f"/tmp/{self.node_id}-{r}.log",
                 "round": self.round_id} for i, r in enumerate(self.ranks)]

    def beat(self, now: float, scheduled: bool = True) -> None:
        if scheduled:
            self.next_beat = now + BEAT_S
        if not self.registered:
            if scheduled:
                self.register()
            return
        self.send(MeshOp.hb, {**self.beats.body({
            "instance": self.instance, "ports": self.ports, "workers": self.workers(), "state": self.state,
            "round": self.round_id, "assigned": self.assigned, "metrics": {}}, now), **self.mesh.state()})

    def on(self, env: Envelope) -> None:
        body = env.body
        if env.op == MeshOp.welcome and body.get("ok"):
            self.registered, self.welcomed_at = True, time.time()
            self.state = str(body.get("role", NodeState.active))
            self.mesh.route(str(body.get("via") or ""))
        elif env.op == MeshOp.relay:
            self.mesh.route(str(body.get("via") or ""))
        elif env.op == MeshOp.hb:
            self.beats.ack(body.get("beat"))
        elif env.op == MeshOp.unknown:
            self.registered, self.running, self.round_id = False, False, 0
            self.register()
        elif env.op == MeshOp.round:
            self.on_round(body)
        elif env.op == MeshOp.go and int(body["round"]) == self.round_id and self.state == NodeState.running:
            if self.running:  # asked again: its `spawned` was lost
                self.report_again("spawned")
            self.spawn()
        elif env.op == MeshOp.probe:
            self.send(MeshOp.pong, {"round": body.get("round")})
        elif env.op == MeshOp.step_query:
            self.send(MeshOp.step_report, {"op_id": body.get("op_id"), "step": None, "step_time": None})
        elif env.op in (MeshOp.left, MeshOp.job_end):
            self.close()

    def on_round(self, body: dict[str, Any]) -> None:
        round_id = body.get("round")
        if round_id is None:
            self.state = str(body.get("state", NodeState.waiting))
            return
        if round_id <= self.round_id:
            if round_id == self.round_id:  # asked again: its `stopped` was lost
                self.report_again("stopped")
            return  # a repeat: already applied
        held = [event_body(EventKind.workers_stopped, round=self.round_id,
                           exit_codes={r: -15 for r in self.ranks})] if self.running else []
        self.running = False
        self.assigned = self.round_id = round_id
        self.state, self.ranks = str(body["state"]), list(body.get("ranks", []))
        self.world_size = int(body.get("world_size", 0))
        self.reports = {}
        self.report("stopped", {"round": round_id, "stopped": time.time(), "events": [e.encode() for e in held]})

    def spawn(self) -> None:
        if self.running:
            return
        self.running, self.go_round = True, self.round_id
        started = event_body(EventKind.workers_started, round=self.round_id, ranks=self.ranks,
                             world_size=self.world_size, pids=[100000 + r for r in self.ranks])
        self.report("spawned", {"round": self.round_id, "spawned": time.time(), "events": [started.encode()]})

    def report(self, phase: str, body: dict[str, Any]) -> None:
        self.reports[phase] = body
        self.send(MeshOp.round_progress, body)

    def report_again(self, phase: str) -> None:
        body = self.reports.get(phase)
        if body is not None and time.time() - float(body[phase]) > LOST_AFTER_S:  # as node.py: older than the limit
            self.send(MeshOp.round_progress, body)

    def close(self, relay: bool = True) -> None:
        """The daemon dies: its connections close and it says nothing more (`relay`: its relay's too, now)."""
        if not self.closed:
            self.closed = True
            for task in self.tasks:
                task.cancel()
            self.mesh.close()
        if relay and self.relay is not None:
            self.relay.close()
            self.relay = None


class Fleet:
    """Many fake members in one process; one loop sends each its heartbeat once a second."""

    def __init__(self, endpoint: str, nproc: int, relays: bool) -> None:
        self.relays = relays
        self.ctx = zmq.asyncio.Context()
        self.ctx.setsockopt(zmq.LINGER, 0)
        self.ctx.set(zmq.MAX_SOCKETS, MAX_SOCKETS)  # libzmq's default is 1,023 sockets a context
        self.endpoint, self.nproc = endpoint, nproc
        self.members: dict[str, FakeMember] = {}

    def add(self, node_id: str, index: int) -> None:
        self.members[node_id] = FakeMember(self.ctx, self.endpoint, node_id, self.nproc, index, self.relays)

    async def beat_loop(self) -> None:
        while True:
            now = time.time()
            for member in self.members.values():
                if not member.closed and now >= member.next_beat:
                    member.beat(now)
            await asyncio.sleep(LOOP_S)

    def live(self) -> list[FakeMember]:
        return [m for m in self.members.values() if not m.closed and m.registered]

    def summary(self, round_id: int) -> dict[str, Any]:
        """The newest round every live member has, whether each has `round_id` and, running in it, its `go`,
        and when the last one was welcomed."""
        live = self.live()
        return {"min_round": min((m.round_id for m in live), default=0),
                "settled": all(m.round_id >= round_id and (m.state != NodeState.running or m.go_round == m.round_id)
                               for m in live),
                "welcomed_at": max((m.welcomed_at for m in self.members.values()), default=0.0)}

    async def serve(self, conn: Connection) -> None:
        """Commands from the parent, one at a time, each answered: ("add", [(id, index)...]), ("close", id),
        ("summary", round_id)."""
        loop = asyncio.get_running_loop()
        beats = asyncio.create_task(self.beat_loop())
        ready = asyncio.Event()
        loop.add_reader(conn.fileno(), ready.set)
        while True:
            await ready.wait()
            ready.clear()
            while conn.poll():
                op, arg = conn.recv()
                if op == "add":
                    for node_id, index in arg:
                        self.add(node_id, index)
                elif op == "close":
                    self.members[arg].close()
                elif op == "stop":  # links first: a relay that went first would make its members fall back
                    for member in self.members.values():
                        member.close(relay=False)
                    for member in self.members.values():
                        member.close()
                    beats.cancel()
                    conn.send(None)
                    return
                conn.send(self.summary(arg) if op == "summary" else None)


def _child(conn: Connection, endpoint: str, nproc: int, relays: bool) -> None:
    asyncio.run(Fleet(endpoint, nproc, relays).serve(conn))


class Fleets:
    """The whole fleet, spread over child processes; members are added, closed and counted through pipes."""

    def __init__(self, endpoint: str, nproc: int, relays: bool, nodes: int) -> None:
        self.relays = relays
        self.ids: list[str] = []
        spawn = multiprocessing.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs = []
        for _ in range(max(1, -(-nodes // per_process()))):
            parent, child = spawn.Pipe()
            proc = spawn.Process(target=_child, args=(child, endpoint, nproc, relays), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def _call(self, i: int, op: str, arg: Any) -> Any:
        self.conns[i].send((op, arg))
        return self.conns[i].recv()

    def add(self, node_ids: list[str]) -> None:
        start = len(self.ids)
        self.ids += node_ids
        for i in range(len(self.conns)):
            mine = [(n, start + k) for k, n in enumerate(node_ids) if (start + k) % len(self.conns) == i]
            if mine:
                self._call(i, "add", mine)

    def close(self, node_id: str) -> None:
        """The member's daemon dies."""
        self._call(self.ids.index(node_id) % len(self.conns), "close", node_id)

    def summary(self, round_id: int = 0) -> dict[str, Any]:
        parts = [self._call(i, "summary", round_id) for i in range(len(self.conns))]
        return {"min_round": min(p["min_round"] for p in parts), "settled": all(p["settled"] for p in parts),
                "welcomed_at": max(p["welcomed_at"] for p in parts)}

    def stop(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc.is_alive():
                with contextlib.suppress(EOFError, OSError):
                    self._call(i, "stop", None)
                proc.join(10)
            if proc.is_alive():
                proc.kill()
