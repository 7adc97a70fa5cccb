"""Worker side of docs/worker-channel.md: a never-blocking DEALER that reports steps and reads requests."""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import zmq

from elasticd.wire.names import WorkerOp
from elasticd.wire.protocol import Envelope, ProtocolError, decode, encode, new_id

if TYPE_CHECKING:
    from trainer_shim.step_fence import StepFence

# What the daemon may ask (docs/worker-channel.md): act at a step boundary, or (`generation`) join a new world.
REQUEST_OPS = frozenset({WorkerOp.checkpoint, WorkerOp.drain, WorkerOp.resize, WorkerOp.generation})
WELCOME_WAIT_S = 2.0  # a daemon that welcomes answers a first hello in milliseconds; a busy one may take longer
CLOSE_LINGER_MS = 500  # at close, how long the last reports (a `drained`, the last step) may take to go out
HOLD_S = 120.0  # a rank held at its start (its round ends without it) waits this long to be stopped
FENCE_WAIT_S = 30.0  # how long a rank waits for its copy of a request another rank acts on at this boundary


@dataclass
class Request:
    """One daemon request (`checkpoint`, `drain`, `resize`) waiting for its step boundary."""

    op: str  # a WorkerOp's value, as the daemon sent it
    request_id: str
    at_step: int | None
    round: int | None = None  # a `resize`'s generation: stale once this rank is in it (or a later one)
    target: int | None = None  # in an in-place job, the boundary every rank agreed on (`Session.agree`)
    all_stay: bool = False  # a `resize` where every rank of the world is in the next one (a join)

    def due(self, step: int, fenced: bool) -> bool:
        if fenced:  # not before the fence settled it: a copy heard late would act a step after the others
            return self.target is not None and step >= self.target
        return self.at_step is None or step >= self.at_step


def _num(value: float | None) -> str:
    # JSON has no NaN/Infinity: the contract sends a non-finite loss as null.
    if value is None:
        return "null"
    value = float(value)
    return repr(value) if math.isfinite(value) else "null"


def _key(name: str) -> str:
    return f'"{name}"' if name.isidentifier() else json.dumps(name)


def _interval(env: dict[str, str] | os._Environ[str]) -> float:
    try:
        return max(0.0, float(env.get("ELASTICD_REPORT_INTERVAL", "0.05")))
    except ValueError:
        return 0.05


class Session:
    """Connected to the daemon's worker ROUTER; every send is NOBLOCK and a full queue is a counted drop.

    Step reports are coalesced: at most one frame per ELASTICD_REPORT_INTERVAL (0.05 s), carrying the latest
    step, loss and metrics and the samples and tokens summed since the last frame. Most calls then cost a
    few arithmetic operations instead of a syscall that wakes zmq's I/O thread.

    Call it from the training thread; events sent from any other thread are queued and go out with the
    training thread's next call, since a zmq socket must stay on one thread.
    """

    enabled = True

    def __init__(self, addr: str, rank: int = 0, local_rank: int = 0, node: str = "",
                 round_id: int = 0, welcome: bool = False) -> None:
        self.rank, self.local_rank, self.node, self.round = rank, local_rank, node, round_id
        self.abort_signal: int | None = None  # trainer_shim.abort: the daemon may send it while a peer is lost
        self.dropped = 0
        self.sent = 0
        self.last_request: Request | None = None  # the request the last true should_* answer acted on
        self._pending: list[Request] = []
        self._fenced = False  # an in-place rank: requests act where `agree` settled them
        self._seen: set[str] = set()
        self._seq = 0
        self._idp = new_id()[:8] + "-"  # cheap unique ids: a per-session prefix plus the sequence number
        # Events from other threads (background saves) queue here: zmq sockets are not thread-safe.
        self._outbox: collections.deque[bytes] = collections.deque()
        self._owner = threading.get_ident()
        self._last = time.perf_counter()  # when the last step frame went out (or the session began)
        self._sent_any = False  # the first step goes out at once: it marks a new world's first step
        self._interval = _interval(os.environ)
        self._held: tuple[int, float | None, dict[str, float]] | None = None  # the latest unsent step
        self._sources: list[Callable[[], dict[str, Any]]] = []  # metrics measured by the shim itself
        self._held_samples = self._held_tokens = self._held_steps = 0
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 1000)
        self._sock.setsockopt(zmq.IMMEDIATE, 0)  # queue while the daemon restarts; the HWM bounds it
        self._sock.connect(addr)
        self._generation: dict[str, Any] | None = None  # the newest `generation` the daemon published to us
        # The step frame's constant parts, precomputed so report() formats only the numbers.
        self._head = '{"v":1,"type":"ev","op":"' + WorkerOp.step + '","id":"' + self._idp
        self._mid = '","node":' + json.dumps(node) + ',"seq":'
        self.rejoin(rank, round_id, in_place=False, welcome=welcome)
        if welcome:
            self._await_welcome()

    def rejoin(self, rank: int, round_id: int, in_place: bool, waiting: bool = False, welcome: bool = False) -> None:
        """Say hello as `rank` of `round_id`: at start, and again on each generation joined in place.

        `welcome`: ask the daemon to answer (the first hello of a process, under a daemon that says it does)."""
        self.rank, self.round = rank, round_id
        self._rank_s = '{"rank":' + str(int(rank)) + ',"step":'
        self._held, self._held_samples, self._held_tokens, self._held_steps = None, 0, 0, 0
        self._sent_any = False  # the first step of a generation goes out at once: it closes its timeline
        self._last = time.perf_counter()
        self._send(self._frame(WorkerOp.hello, {"rank": rank, "local_rank": self.local_rank, "pid": os.getpid(),
                                                "round": round_id, "in_place": in_place, "waiting": waiting,
                                                **({"welcome": True} if welcome else {}),
                                                **({"abort_signal": self.abort_signal} if self.abort_signal else {})}))

    def _await_welcome(self) -> None:
        """Before the first step: a drain agreed in this round while this rank was starting is its own too (it
        arrives first, as a request), and with no agreed step the round ends without this rank, which is held
        rather than train a step that would be lost and trained again (docs/worker-channel.md, `welcome`)."""
        deadline = time.monotonic() + WELCOME_WAIT_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                if not self._sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                    return
                frame = self._sock.recv_multipart(zmq.NOBLOCK)[-1]
                env = decode(frame)
            except (zmq.ZMQError, ProtocolError):
                continue
            if env.op == WorkerOp.welcome:
                if env.body.get("hold") is True:
                    _hold()
                return
            self._accept(frame)  # a request that came first (the round's drain): queued as any other

    # -- sending --------------------------------------------------------------------------------------
    def _frame(self, op: WorkerOp, body: dict[str, Any]) -> bytes:
        self._seq += 1
        env = Envelope(type="ev", op=op, body=body, id=f"{self._idp}{self._seq}", node=self.node,
                       seq=self._seq, ts=time.time())
        return encode(env)

    def _send(self, frame: bytes) -> None:
        if threading.get_ident() != self._owner:
            self._outbox.append(frame)
            return
        if self._outbox:
            self._flush()
        try:
            self._sock.send(frame, zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            self.dropped += 1
        except zmq.ZMQError:  # closed socket: training goes on, the report is lost
            self.dropped += 1

    def _flush(self) -> None:
        while self._outbox:
            frame = self._outbox.popleft()
            try:
                self._sock.send(frame, zmq.NOBLOCK)
                self.sent += 1
            except zmq.ZMQError:
                self.dropped += 1

    def report(self, step: int, loss: float | None = None, samples: int = 0, tokens: int = 0,
               **metrics: float) -> None:
        """Record one step (also the heartbeat); never blocks. Pass loss as a float, not a tensor."""
        for source in self._sources:
            metrics = {**source(), **metrics}
        self._held = (step, loss, metrics)
        self._held_samples += samples
        self._held_tokens += tokens
        self._held_steps += 1
        if not self._sent_any or time.perf_counter() - self._last >= self._interval:
            self._send_held()

    def _send_held(self) -> None:
        if self._held is None:
            return
        step, loss, metrics = self._held
        now = time.perf_counter()
        step_time, self._last = (now - self._last) / self._held_steps, now
        self._seq += 1
        seq = self._seq
        # Identifier names (the usual keyword case) need no JSON escaping; anything else goes through json.
        met = "{" + ",".join(f'{_key(k)}:{_num(v)}' for k, v in metrics.items()) + "}" if metrics else "{}"
        frame = (f'{self._head}{seq}{self._mid}{seq},"ts":{time.time()!r},"body":{self._rank_s}{int(step)},'
                 f'"loss":{_num(loss)},"samples":{int(self._held_samples)},"tokens":{int(self._held_tokens)},'
                 f'"step_time":{step_time!r},"metrics":{met},"dropped":{self.dropped}}}}}')
        self._held, self._held_samples, self._held_tokens, self._held_steps = None, 0, 0, 0
        self._sent_any = True
        self._send(frame.encode())

    def add_metrics(self, source: Callable[[], dict[str, Any]]) -> None:
        """Metrics the shim measures itself (trainer_shim.step_timing), sent with each step's own."""
        if source not in self._sources:
            self._sources.append(source)

    def report_checkpoint(self, step: int, path: str, nbytes: int, duration_s: float,
                          request_id: str | None = None) -> None:
        self._send_held()  # the daemon sees the step a save belongs to before the save itself
        self._send(self._frame(WorkerOp.checkpoint, {"rank": self.rank, "step": int(step), "path": str(path),
                                                     "bytes": int(nbytes), "duration_s": float(duration_s),
                                                     "request_id": request_id}))

    def report_skipped(self, path: str, reason: str) -> None:
        body = {"rank": self.rank, "path": str(path), "reason": reason}
        self._send(self._frame(WorkerOp.checkpoint_skipped, body))

    def drained(self, step: int, request_id: str | None = None) -> None:
        rid = request_id if request_id is not None else self.last_request_id
        self._send_held()
        self._send(self._frame(WorkerOp.drained, {"rank": self.rank, "step": int(step), "request_id": rid}))

    def left(self, step: int, request_id: str | None, error: str | None = None) -> None:
        """This rank left its process group after `step` (at the agreed step, or on a collective error)."""
        self._send_held()
        self._send(self._frame(WorkerOp.left, {"rank": self.rank, "pid": os.getpid(), "round": self.round,
                                               "step": int(step), "request_id": request_id, "error": error}))

    def joined(self, round_id: int, step: int, in_place: bool, timeline: dict[str, float],
               heal: dict[str, Any] | None = None) -> None:
        """This rank is in generation `round_id` and holds the freshest state (timeline: wall-clock seconds;
        heal: what it received and sent, trainer_shim.heal)."""
        self._send(self._frame(WorkerOp.joined, {"rank": self.rank, "pid": os.getpid(), "round": round_id,
                                                 "step": int(step), "in_place": in_place, **timeline,
                                                 **({"heal": heal} if heal else {})}))

    def resize_failed(self, round_id: int, reason: str) -> None:
        self._send(self._frame(WorkerOp.resize_failed, {"rank": self.rank, "pid": os.getpid(), "round": round_id,
                                                        "reason": reason}))

    def wait_generation(self, after_round: int, timeout_s: float) -> dict[str, Any] | None:
        """Block until the daemon publishes a generation newer than `after_round`; None on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            gen = self._generation
            if gen is not None and int(gen.get("round", 0)) > after_round:
                return gen
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with contextlib.suppress(zmq.ZMQError):
                self._sock.poll(int(min(left, 0.5) * 1000) + 1, zmq.POLLIN)

    # -- receiving ------------------------------------------------------------------------------------
    def poll(self) -> None:
        """Read every queued request without waiting; each new one is acknowledged."""
        try:
            if not cast(int, self._sock.get(zmq.EVENTS)) & zmq.POLLIN:  # one cheap call when nothing is queued
                return
            while True:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
                self._accept(frames[-1])
        except zmq.ZMQError:
            return

    def _accept(self, frame: bytes) -> None:
        try:
            env = decode(frame)
        except ProtocolError:
            return  # a malformed frame must not stop training
        if env.type != "req" or env.op not in REQUEST_OPS:
            return
        if env.op == WorkerOp.generation:
            if isinstance(env.body.get("round"), int):
                self._generation = dict(env.body)
            return
        rid = str(env.body.get("request_id") or env.id)
        at = env.body.get("at_step")
        if rid in self._seen:
            return
        self._seen.add(rid)
        at_step = at if isinstance(at, int) and not isinstance(at, bool) else None
        gen = env.body.get("round")
        self._pending.append(Request(env.op, rid, at_step, gen if isinstance(gen, int) else None,
                                     all_stay=env.body.get("all_stay") is True))
        self._send(self._frame(WorkerOp.ack, {"rank": self.rank, "request_id": rid, "op": env.op}))

    def agree(self, step: int, fence: StepFence, wait_s: float = FENCE_WAIT_S) -> None:
        """At a step boundary of an in-place job, before the next step: settle where each request acts, the same
        boundary on every rank however late its copy came. One heard in time acts at its `at_step`; one heard
        too late acts here if another rank's copy made this boundary due, else at the next boundary. When
        another rank acts here, this one waits for its own copy (docs/worker-channel.md, "Step fence")."""
        self._fenced = True
        self._drop_stale()
        here = fence.marked(step)
        deadline = time.monotonic() + wait_s
        while True:
            for req in (r for r in self._pending if r.target is None):
                self._settle(req, step, here, fence)
            if not here or any(r.target is not None and r.target <= step for r in self._pending):
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"elastic: rank {self.rank}: another rank acts on a request at step {step}, and "
                                 f"none reached this rank within {wait_s:.0f}s")
            with contextlib.suppress(zmq.ZMQError):
                self._sock.poll(100, zmq.POLLIN)
            self._drop_stale()

    @staticmethod
    def _settle(req: Request, step: int, here: bool, fence: StepFence) -> None:
        if req.at_step is not None and req.at_step > step:
            req.target = req.at_step
        else:
            req.target = step if here else step + 1
        if req.target > step:
            fence.mark(req.target)

    def _drop_stale(self) -> None:
        """Read what is queued; a `resize` toward a generation this rank already joined crossed its own `left` (it
        left on an error first): acting on it would leave the new group too (docs/worker-channel.md)."""
        self.poll()
        self._pending = [r for r in self._pending if r.op != WorkerOp.resize or r.round is None or r.round > self.round]

    def unfence(self) -> None:
        """A new generation: its fence starts empty, and every request still held is settled again in it."""
        for req in self._pending:
            req.target = None

    def _take(self, op: WorkerOp, step: int) -> bool:
        self._drop_stale()
        for req in self._pending:
            if req.op == op and req.due(step, self._fenced):
                self._pending.remove(req)
                self.last_request = req
                return True
        return False

    def should_checkpoint(self, step: int) -> bool:
        """True once, at the first boundary whose completed step reaches a checkpoint request's at_step."""
        return self._take(WorkerOp.checkpoint, step)

    def should_stop(self, step: int) -> bool:
        """True once a drain is due: save, report_checkpoint, drained(step), then exit 0."""
        return self._take(WorkerOp.drain, step)

    def should_resize(self, step: int) -> bool:
        """True once an in-place resize is due (trainer_shim.Elastic acts on it; scripts need not)."""
        return self._take(WorkerOp.resize, step)

    def left_group(self) -> None:
        """This rank just left its group: every `resize` received so far asked for that, and is done."""
        self.poll()
        self._pending = [r for r in self._pending if r.op != WorkerOp.resize]

    @property
    def last_request_id(self) -> str | None:
        return self.last_request.request_id if self.last_request else None

    @property
    def pending(self) -> list[Request]:
        return list(self._pending)

    def close(self) -> None:
        if self._sock.closed:
            return
        self._send_held()
        if self._outbox:
            self._flush()
        self._sock.close(linger=CLOSE_LINGER_MS)
        self._ctx.term()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _hold() -> None:
    """Wait to be stopped with the round: a SIGTERM ends it at once (a framework's handler, already installed,
    would only take note). If nothing stops it within HOLD_S, its pending drain applies at its first step."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL) if main else None
    try:
        time.sleep(HOLD_S)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
