"""The daemon's end of the trainer_shim channel (docs/worker-channel.md): metrics, requests, hang checks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from elasticd.job.config import JobConfig, StartError
from elasticd.job.runtime import worker_socket
from elasticd.wire.names import EventKind, NodeState, WorkerOp
from elasticd.wire.protocol import Envelope, decode, encode, new_id
from elasticd.wire.worker_reports import IN_ROUND, Acked, Drained, Saved, SaveSkipped

if TYPE_CHECKING:
    from elasticd.member.agent import NodeAgent

log = logging.getLogger("elasticd")


ReportHandler = Callable[[Any, float], None]  # (the op's record, wire/worker_reports.py IN_ROUND; now)
WELCOMES_ENV = "ELASTICD_WELCOMES"  # tells the shim that a hello asking for a `welcome` gets one


class WorkerChannel:
    """The daemon's ROUTER for its workers: their reports in (by op), its requests out (by rank's round or pid)."""

    def __init__(self, ctx: zmq.asyncio.Context, cfg: JobConfig, node: NodeAgent) -> None:
        self.ctx = ctx
        self.cfg = cfg
        self.node = node
        self.sock: zmq.asyncio.Socket | None = None
        self.path = ""
        self.idents: dict[int, tuple[bytes, int]] = {}  # rank -> (identity, round)
        self.hung_reported: set[tuple[int, int]] = set()
        self.dropped_frames = 0
        self.pids: dict[int, bytes] = {}  # pid -> identity: a worker kept in place keeps its socket, not its rank
        self.round_drain: tuple[int, dict[str, Any]] | None = None  # (round, the drain asked of its workers)
        node.in_place.send = self.send_to_pid
        # From a worker between rounds: its rank and round are changing.
        self.between_rounds: dict[str, Callable[[dict[str, Any]], None]] = {
            WorkerOp.left: node.in_place.on_left, WorkerOp.joined: node.in_place.on_joined,
            WorkerOp.resize_failed: node.in_place.on_failed}
        # From a rank of the node's round.
        self.in_round: dict[str, ReportHandler] = {
            WorkerOp.step: self.node.step_reported, WorkerOp.checkpoint: self.on_checkpoint,
            WorkerOp.checkpoint_skipped: self.on_checkpoint_skipped, WorkerOp.drained: self.on_drained,
            WorkerOp.ack: self.on_ack}

    def bind(self) -> dict[str, str]:
        self.path = worker_socket(self.cfg.job_id, self.cfg.node_id, os.getpid())
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 100)
        try:
            self.sock.bind(f"ipc://{self.path}")
        except zmq.ZMQError as exc:
            raise StartError(f"cannot bind the worker channel ipc://{self.path}: {exc}") from None
        return {"ELASTICD_WORKER_ADDR": f"ipc://{self.path}", WELCOMES_ENV: "1"}

    async def serve(self) -> None:
        assert self.sock is not None
        while True:
            frames = await self.sock.recv_multipart()
            if len(frames) != 2:
                self.dropped_frames += 1
                continue
            try:
                env = decode(frames[1])
                self.on_message(frames[0], env)
            except Exception as exc:  # one bad frame must never end the loop that watches every worker
                self.dropped_frames += 1
                log.debug("worker channel: dropped a bad frame: %r", exc)
            await asyncio.sleep(0)

    def on_message(self, ident: bytes, env: Envelope) -> None:
        body, now = env.body, time.time()
        rank = int(body["rank"])
        if env.op == WorkerOp.hello:
            self.on_hello(ident, rank, body, now)
        elif env.op in self.between_rounds:
            self.between_rounds[env.op](body)
        elif env.op in self.in_round and self.node.rank_reports.has(rank, self.node.round_id):
            self.in_round[env.op](IN_ROUND[env.op].decode(body, env.op), now)  # else an old round's worker

    def on_hello(self, ident: bytes, rank: int, body: dict[str, Any], now: float) -> None:
        round_id = int(body.get("round", self.node.round_id))
        in_place = body.get("in_place") is True
        self.idents[rank] = (ident, round_id)
        self.pids[int(body.get("pid", 0))] = ident
        self.node.in_place.on_hello(int(body.get("pid", 0)), body)
        if body.get("welcome") is True:
            self.welcome(ident, round_id)
        if body.get("waiting") is True:
            return  # started before its round: its rank is a placeholder, no metrics until it joins one
        self.node.rank_reports.hello(rank, round_id, now, in_place)

    def welcome(self, ident: bytes, round_id: int) -> None:
        """Answer a worker's first hello before it trains. A drain agreed in its round while it was still
        starting (its node answered the step query with no shim rank) is its drain too; with no agreed step the
        round ends without it, and it is held: a step it trained now would be lost and trained again."""
        drain = self.round_drain[1] if self.round_drain and self.round_drain[0] == round_id else None
        if drain is not None:
            self.send_to(ident, WorkerOp.drain, drain)
        self.send_to(ident, WorkerOp.welcome, {"hold": drain is not None and drain.get("at_step") is None})

    def on_checkpoint(self, saved: Saved, now: float) -> None:
        self.node.rank_reports.checkpoint(saved, now)
        self.node.event(EventKind.checkpoint_saved, rank=saved.rank, step=saved.step, path=saved.path,
                        bytes=saved.bytes, duration_s=saved.duration_s, request_id=saved.request_id)

    def on_checkpoint_skipped(self, skipped: SaveSkipped, _now: float) -> None:
        self.node.event(EventKind.checkpoint_skipped, rank=skipped.rank, path=skipped.path, reason=skipped.reason)

    def on_drained(self, drained: Drained, _now: float) -> None:
        self.node.rank_reports.drained(drained.rank, drained.step)
        self.node.drained_ranks.add(drained.rank)
        self.node.check_drained()

    def on_ack(self, acked: Acked, _now: float) -> None:
        self.node.rank_reports.ack(acked.rank, acked.request_id)

    def request(self, op: WorkerOp, body: dict[str, Any]) -> int:
        """Send checkpoint/drain to this round's shim workers; returns how many were asked."""
        if self.sock is None:
            return 0
        payload = {"request_id": body.get("request_id") or new_id(), "at_step": body.get("at_step")}
        if op == WorkerOp.drain:
            self.round_drain = (self.node.round_id, payload)  # also for the ranks that say hello later
        frame = encode(Envelope("req", op, payload, node=self.cfg.node_id, ts=time.time()))
        sent = 0
        for ident, round_id in list(self.idents.values()):
            if round_id == self.node.round_id:
                try:
                    self.sock.send_multipart([ident, frame], flags=zmq.NOBLOCK)
                    sent += 1
                except zmq.ZMQError:
                    self.dropped_frames += 1
        return sent

    def send_to_pid(self, pid: int, op: WorkerOp, body: dict[str, Any]) -> bool:
        """One request to one worker (in-place resizes address a process, whatever its rank)."""
        ident = self.pids.get(pid)
        return ident is not None and self.send_to(ident, op, body)

    def send_to(self, ident: bytes, op: WorkerOp, body: dict[str, Any]) -> bool:
        if self.sock is None:
            return False
        frame = encode(Envelope("req", op, body, node=self.cfg.node_id, ts=time.time()))
        try:
            self.sock.send_multipart([ident, frame], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            self.dropped_frames += 1
            return False
        return True

    def check_hangs(self, now: float) -> None:
        hung = {}
        for rank, silent in self.node.rank_reports.silent(self.node.round_id, now, self.cfg.hang_timeout_s):
            key = (rank, self.node.round_id)
            if self.node.state == NodeState.running and key not in self.hung_reported \
                    and rank not in self.node.drained_ranks:
                self.hung_reported.add(key)
                hung[rank] = silent
        if hung:
            self.node.report_hangs(hung)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
