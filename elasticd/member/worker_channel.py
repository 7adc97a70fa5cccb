"""The daemon's end of the trainer_shim channel (docs/worker-channel.md): metrics, requests, hang checks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from elasticd.job.config import JobConfig, StartError
from elasticd.job.runtime import worker_socket
from elasticd.wire.assignment import ResizeRequest, WorkerRequest
from elasticd.wire.names import EventKind, NodeState, WorkerOp
from elasticd.wire.protocol import Envelope, ProtocolError, decode, encode, new_id
from elasticd.wire.record import Record
from elasticd.wire.worker_reports import (
    FROM_WORKER,
    Acked,
    Drained,
    Hello,
    Joined,
    JoinFailed,
    LeftGroup,
    Saved,
    SaveSkipped,
)
from elasticd.wire.worker_requests import AtStep, Resize, WorkerWelcome

if TYPE_CHECKING:
    from elasticd.member.agent import NodeAgent

log = logging.getLogger("elasticd")


ReportHandler = Callable[[Any, float], None]  # (the op's record, wire/worker_reports.py IN_ROUND; now)
WELCOMES_ENV = "ELASTICD_WELCOMES"  # tells the shim that a hello asking for a `welcome` gets one
WARN_EVERY_S = 60.0  # a worker that keeps sending one bad frame is warned of once a minute, not per frame


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
        self.round_drain: tuple[int, AtStep] | None = None  # (round, the drain asked of its workers)
        self.warned: dict[str, float] = {}  # a reason, its numbers aside -> when it was last warned of
        node.in_place.reach_workers(self.send_to_pid)
        # From a rank of the node's round (wire/worker_reports.py IN_ROUND).
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
            except ProtocolError as err:  # not JSON, or a shim of another protocol version
                self.dropped_frames += 1
                self.malformed("a bad frame", err.reason)
                continue
            try:
                self.on_message(frames[0], env)
            except ProtocolError as err:  # a body its record refuses: a shim of another version, or a bug
                self.dropped_frames += 1
                self.malformed(f"a malformed {env.op}", err.reason)
            except Exception as exc:  # one bad frame must never end the loop that watches every worker
                self.dropped_frames += 1
                log.debug("worker channel: dropped a bad frame: %r", exc)
            await asyncio.sleep(0)

    def malformed(self, what: str, reason: str) -> None:
        """Said, not acted on; the worker goes on. Once a minute per reason (its numbers aside): a worker may send
        the same bad frame every step, while each different fault is worth its line."""
        now, key = time.monotonic(), re.sub(r"\d+", "#", reason)
        quiet = now - self.warned.get(key, -WARN_EVERY_S) < WARN_EVERY_S
        if not quiet:
            self.warned[key] = now
        log.log(logging.DEBUG if quiet else logging.WARNING, "[%s] worker channel: dropped %s: %s",
                self.cfg.node_id, what, reason)

    def on_message(self, ident: bytes, env: Envelope) -> None:
        kind = FROM_WORKER.get(env.op)
        if kind is None:
            return  # not a worker's op (a newer shim's, or a stray frame)
        report, now = kind.decode(env.body, env.op, env.size), time.time()
        if isinstance(report, Hello):
            self.on_hello(ident, report, now)
        elif isinstance(report, LeftGroup):
            self.node.in_place.on_left(report)
        elif isinstance(report, Joined):
            self.node.in_place.on_joined(report)
        elif isinstance(report, JoinFailed):
            self.node.in_place.on_failed(report)
        elif self.node.rank_reports.has(report.rank, self.node.round_id):
            self.in_round[env.op](report, now)  # else an old round's worker

    def on_hello(self, ident: bytes, hello: Hello, now: float) -> None:
        round_id = self.node.round_id if hello.round is None else hello.round
        self.idents[hello.rank] = (ident, round_id)
        self.pids[hello.pid] = ident
        self.node.in_place.on_hello(hello)
        if hello.welcome:
            self.welcome(ident, round_id)
        if hello.waiting:
            return  # started before its round: its rank is a placeholder, no metrics until it joins one
        self.node.rank_reports.hello(hello.rank, round_id, now, hello.in_place)

    def welcome(self, ident: bytes, round_id: int) -> None:
        """Answer a worker's first hello before it trains. A drain agreed in its round while it was still
        starting (its node answered the step query with no shim rank) is its drain too; with no agreed step the
        round ends without it, and it is held: a step it trained now would be lost and trained again."""
        drain = self.round_drain[1] if self.round_drain and self.round_drain[0] == round_id else None
        if drain is not None:
            self.send_to(ident, WorkerOp.drain, drain)
        self.send_to(ident, WorkerOp.welcome, WorkerWelcome(hold=drain is not None and drain.at_step is None))

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

    def request(self, op: WorkerOp, asked: WorkerRequest) -> int:
        """Send checkpoint/drain/resize to this round's shim workers; returns how many were asked."""
        if self.sock is None:
            return 0
        request_id = asked.request_id or new_id()
        ask = Resize(request_id, asked.at_step, all_stay=asked.all_stay) if isinstance(asked, ResizeRequest) \
            else AtStep(request_id, asked.at_step)
        if op == WorkerOp.drain:
            self.round_drain = (self.node.round_id, ask)  # also for the ranks that say hello later
        frame = encode(Envelope("req", op, ask.encode(), node=self.cfg.node_id, ts=time.time()))
        sent = 0
        for ident, round_id in list(self.idents.values()):
            if round_id == self.node.round_id:
                try:
                    self.sock.send_multipart([ident, frame], flags=zmq.NOBLOCK)
                    sent += 1
                except zmq.ZMQError:
                    self.dropped_frames += 1
        return sent

    def send_to_pid(self, pid: int, op: WorkerOp, body: Record) -> bool:
        """One request to one worker (in-place resizes address a process, whatever its rank)."""
        ident = self.pids.get(pid)
        return ident is not None and self.send_to(ident, op, body)

    def send_to(self, ident: bytes, op: WorkerOp, body: Record) -> bool:
        if self.sock is None:
            return False
        frame = encode(Envelope("req", op, body.encode(), node=self.cfg.node_id, ts=time.time()))
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
