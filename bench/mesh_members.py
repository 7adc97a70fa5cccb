"""Simulated member daemons on real DEALER sockets: the mesh side of member.py + node.py, without workers."""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import zmq
import zmq.asyncio

from elasticd.beats import BeatDiff
from elasticd.mesh import configure_member
from elasticd.names import EventKind, MeshOp, NodeState
from elasticd.node import event_body
from elasticd.protocol import MAX_REPLY_BYTES, Envelope, decode, encode

BEAT_S = 1.0
LOST_AFTER_S = 3 * BEAT_S  # the loss limit: a report older than this and still asked for was lost
MAX_SOCKETS = 16384
LOOP_S = 0.05  # heartbeats go out spread over the second, as independent daemons' would


class FakeMember:
    """One node: registers, heartbeats with changes only, and applies each round at once (no workers)."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, node_id: str, nproc: int, index: int) -> None:
        self.node_id, self.nproc = node_id, nproc
        self.instance = os.urandom(6).hex()
        self.sock = ctx.socket(zmq.DEALER)
        configure_member(self.sock)  # as a real member's: its transport heartbeats reach the coordinator too
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IDENTITY, f"{node_id}|{self.instance}".encode())
        self.sock.setsockopt(zmq.SNDHWM, 10000)
        self.sock.connect(endpoint)
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

    def send(self, op: str, body: dict[str, Any]) -> None:
        if not self.closed:
            frame = encode(Envelope("req", op, body, node=self.node_id, ts=time.time()))
            self.sock.send(frame, flags=zmq.NOBLOCK)

    def register(self) -> None:
        self.beats.reset()
        self.send(MeshOp.register, {"instance": self.instance, "host": "127.0.0.1", "nproc": self.nproc,
                                    "node_rank": -1, "ports": self.ports, "control": "", "pub": ""})

    def workers(self) -> list[dict[str, Any]]:
        if not self.running:
            return []
        return [{"pid": 100000 + r, "local_rank": i, "rank": r, "state": "running", "exit_code": None,
                 "cpu_percent": 99.0, "rss": 1 << 30, "uptime_s": 1.0, "log": f"/tmp/{self.node_id}-{r}.log",
                 "round": self.round_id} for i, r in enumerate(self.ranks)]

    def beat(self, now: float) -> None:
        self.next_beat = now + BEAT_S
        if not self.registered:
            self.register()
            return
        self.send(MeshOp.hb, self.beats.body({
            "instance": self.instance, "ports": self.ports, "workers": self.workers(), "state": self.state,
            "round": self.round_id, "assigned": self.assigned, "metrics": {}}, now))

    def on(self, env: Envelope) -> None:
        body = env.body
        if env.op == MeshOp.welcome and body.get("ok"):
            self.registered, self.welcomed_at = True, time.time()
            self.state = str(body.get("role", NodeState.active))
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
        self.report("stopped", {"round": round_id, "stopped": time.time(), "events": held})

    def spawn(self) -> None:
        if self.running:
            return
        self.running, self.go_round = True, self.round_id
        started = event_body(EventKind.workers_started, round=self.round_id, ranks=self.ranks,
                             world_size=self.world_size, pids=[100000 + r for r in self.ranks])
        self.report("spawned", {"round": self.round_id, "spawned": time.time(), "events": [started]})

    def report(self, phase: str, body: dict[str, Any]) -> None:
        self.reports[phase] = body
        self.send(MeshOp.round_progress, body)

    def report_again(self, phase: str) -> None:
        body = self.reports.get(phase)
        if body is not None and time.time() - float(body[phase]) > LOST_AFTER_S:  # as node.py: older than the limit
            self.send(MeshOp.round_progress, body)

    async def serve(self) -> None:
        while not self.closed:
            try:
                payload = await self.sock.recv()
            except zmq.ZMQError:
                return
            self.on(decode(payload, MAX_REPLY_BYTES))

    def close(self) -> None:
        """The daemon dies: its connection closes and it says nothing more."""
        if not self.closed:
            self.closed = True
            self.sock.close(linger=0)


class Fleet:
    """Many fake members in one process; one loop sends each its heartbeat once a second."""

    def __init__(self, endpoint: str, nproc: int) -> None:
        self.ctx = zmq.asyncio.Context()
        self.ctx.setsockopt(zmq.LINGER, 0)
        self.ctx.set(zmq.MAX_SOCKETS, MAX_SOCKETS)  # libzmq's default is 1,023 sockets a context
        self.endpoint, self.nproc = endpoint, nproc
        self.members: dict[str, FakeMember] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def add(self, node_id: str) -> FakeMember:
        member = self.members[node_id] = FakeMember(self.ctx, self.endpoint, node_id, self.nproc, len(self.members))
        self.tasks.append(asyncio.create_task(member.serve()))
        return member

    async def beat_loop(self) -> None:
        while True:
            now = time.time()
            for member in self.members.values():
                if not member.closed and now >= member.next_beat:
                    member.beat(now)
            await asyncio.sleep(LOOP_S)

    def settled(self, round_id: int) -> bool:
        """Every live member has round `round_id` (or a newer one), and each one running in it got `go`."""
        live = [m for m in self.members.values() if not m.closed and m.registered]
        return all(m.round_id >= round_id and (m.state != NodeState.running or m.go_round == m.round_id)
                   for m in live)
