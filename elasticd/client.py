"""Python client for the elasticd API: sync and asyncio calls with timeouts, and resyncing subscriptions."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import zmq
import zmq.asyncio

from elasticd.job.runtime import live_daemons
from elasticd.wire.handshake import WATCHED, Failure, Handshake
from elasticd.wire.protocol import MAX_REPLY_BYTES, Envelope, ErrorCode, ProtocolError, decode, encode, new_id
from elasticd.wire.read_replies import MetricsReply, RankRow, StatusReply
from elasticd.wire.verb_replies import ErrorReply, Steered

DEFAULT_TIMEOUT_S = 5.0
_UNREACHABLE = "no connection to send {op!r} on within {limit:.1f}s (daemon down, or its keys refused ours?)"
CLOSED = "the connection was closed while the call waited (the client was closed)"


class ClientError(Exception):
    """The daemon answered with an error, or did not answer in time."""

    def __init__(self, code: str, reason: str, errno: int = 0) -> None:
        super().__init__(f"{code}: {reason}")
        self.code, self.reason, self.errno = code, reason, errno


@dataclass
class Endpoints:
    """Where one daemon answers: its control socket, its PUB, and which node and job it serves."""

    control: str
    pub: str = ""
    node: str = ""
    job_id: str = ""
    server_key: str = ""


@dataclass(frozen=True)
class Credentials:
    """A client's CURVE key pair and the job's server key (see elasticd/keys/auth.py)."""

    public: bytes
    secret: bytes
    server: bytes

    @classmethod
    def load(cls, key_file: str, server_key: str) -> Credentials:
        from elasticd.keys.auth import load_client_key, load_public

        public, secret = load_client_key(key_file)
        return cls(public, secret, load_public(server_key))

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = self.secret, self.public, self.server


@dataclass
class Event:
    """One telemetry message: an event (`type` ev) or a daemon heartbeat (`type` hb)."""

    type: str
    kind: str
    node: str
    seq: int
    ts: float
    body: dict[str, Any] = field(default_factory=dict)


def discover(job_id: str = "") -> list[Endpoints]:
    """Daemons running on this host, from their endpoint files; coordinators first."""
    found = [d for d in live_daemons() if not job_id or d.get("job_id") == job_id]
    found.sort(key=lambda d: (not d.get("coordinator"), d.get("job_id", ""), d.get("node_id", "")))
    return [Endpoints(d["control"], d.get("pub", ""), d.get("node_id", ""), d.get("job_id", ""),
                      d.get("server_key", "")) for d in found]


def _unwrap(env: Envelope) -> dict[str, Any]:
    try:
        error = ErrorReply.of(env.body)
    except ProtocolError as err:  # an error reply without its errno, code and reason
        raise ClientError(ErrorCode.NAMES[err.errno], err.reason, err.errno) from None
    if error is not None:
        raise ClientError(error.code, error.reason, error.errno)
    return env.body


def _request(op: str, args: dict[str, object]) -> tuple[str, bytes]:
    msg_id = new_id()
    return msg_id, encode(Envelope("req", op, {**args, "client": _who()}, id=msg_id, ts=time.time()))


def _who() -> str:
    import getpass
    import socket

    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        return "unknown"


class Client:
    """Blocking client. Every call has a timeout; a lost reply never wedges the socket (DEALER)."""

    def __init__(self, control: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 credentials: Credentials | None = None) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.credentials = credentials
        self.sock = _socket(self.ctx, zmq.DEALER, credentials)
        self.handshake = Handshake(control, credentials is not None)
        self.monitor = self.sock.get_monitor_socket(WATCHED)  # before connect: the first handshake counts too
        self.sock.connect(control)
        self.timeout_s = timeout_s

    def call(self, op: str, timeout_s: float | None = None, **args: object) -> dict[str, Any]:
        msg_id, frame = _request(op, args)
        limit = timeout_s or self.timeout_s
        deadline = time.monotonic() + limit
        # A DEALER with no live connection (a refused CURVE handshake drops it) would block in send().
        while True:
            if not self._ready(zmq.POLLOUT, deadline):
                raise ClientError("timeout", _UNREACHABLE.format(op=op, limit=limit), ErrorCode.TIMEOUT)
            try:
                self.sock.send(frame, flags=zmq.NOBLOCK)
                break
            except zmq.Again:  # the connection went between the poll and the send: a refusal's verdict is on its way
                continue
        while self._ready(zmq.POLLIN, deadline):
            try:
                env = decode(self.sock.recv(), MAX_REPLY_BYTES, from_daemon=True)
            except ProtocolError:
                continue
            if env.id == msg_id:
                return _unwrap(env)
        raise ClientError("timeout", f"no answer to {op!r} within {timeout_s or self.timeout_s:.1f}s",
                          ErrorCode.TIMEOUT)

    def _ready(self, flag: int, deadline: float) -> bool:
        """Wait until the socket can `flag` (True) or the deadline passes (False); a failed handshake raises."""
        poller = zmq.Poller()
        poller.register(self.sock, flag)
        poller.register(self.monitor, zmq.POLLIN)
        while (left := deadline - time.monotonic()) > 0:
            ready = dict(poller.poll(int(left * 1000) + 1))
            while self.monitor.poll(0):
                self.handshake.feed(self.monitor.recv_multipart())
            if self.handshake.failure is not None:
                raise refused(self.handshake.failure)
            if self.sock in ready:
                return True
        return False

    def status(self) -> StatusReply:
        return StatusReply.decode(self.call("status"), "status reply")

    def metrics(self) -> list[RankRow]:
        return MetricsReply.decode(self.call("metrics"), "metrics reply").ranks

    def steer(self, op: str, dry_run: bool = False, force: bool = False, **args: object) -> Steered:
        """scale (nodes=N), drain/cordon/uncordon (node=...), checkpoint, restart, kill-worker, stop."""
        # The timeout given by position: an argument of the verb can never be taken for it.
        return Steered.decode(self.call(op, None, dry_run=dry_run, force=force, **args), f"{op} reply")

    def close(self) -> None:
        _close(self.sock, self.monitor)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subscribe(self, pub: str, idle_timeout_s: float = 3.0, since_seq: int | None = None) -> Iterator[Event]:
        """Events after a snapshot (or after `since_seq`), in order, plus heartbeats; gaps are fetched."""
        sub = _subscriber(self.ctx, pub, self.credentials)
        try:
            # Subscribe first, then take the snapshot's seq: nothing can fall between the two.
            seq = _Sequence(int(self.call("status")["seq"]) if since_seq is None else since_seq)
            while True:
                if not sub.poll(int(idle_timeout_s * 1000)):
                    yield Event("idle", "idle", "", seq.last, time.time())
                    continue
                event = parse_telemetry(sub.recv_multipart())
                if event is None:
                    continue
                if seq.gap(event):
                    yield from seq.fill(self.call("events", since_seq=seq.last, limit=0)["events"], event)
                if seq.accept(event):
                    yield event
        finally:
            sub.close()


SocketT = TypeVar("SocketT", bound=zmq.Socket[Any])  # a blocking or an asyncio socket, as its context makes

def _socket(ctx: zmq.Context[SocketT], kind: int, credentials: Credentials | None) -> SocketT:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if credentials is not None:
        credentials.apply(sock)
    return sock


def _close(sock: zmq.Socket[Any], monitor: zmq.Socket[Any]) -> None:
    """Once: a second close (a `with` block after an explicit one) does nothing."""
    if sock.closed:
        return
    sock.disable_monitor()
    monitor.close()
    sock.close()


def refused(failure: Failure) -> ClientError:
    """A failed handshake as the error a call raises: the daemon never saw the request, so no reply says why."""
    return ClientError(failure.code, failure.reason, ErrorCode.UNAUTHORIZED)


def _subscriber(ctx: zmq.Context[SocketT], pub: str, credentials: Credentials | None,
                topics: tuple[str, ...] = ("",)) -> SocketT:
    sub = _socket(ctx, zmq.SUB, credentials)
    for topic in topics:
        sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(pub)
    return sub


class _Sequence:
    """Where a subscription stands in the job's event numbering, and what a new message says is missing."""

    def __init__(self, last: int) -> None:
        self.last = last

    def gap(self, event: Event) -> bool:
        """An event numbered n shows events up to n-1 exist; a heartbeat carrying n shows events up to n."""
        return self._top(event) > self.last + 1

    def _top(self, event: Event) -> int:
        return event.seq if event.type == "ev" else event.seq + 1 if event.type == "hb" else 0

    def fill(self, history: list[dict[str, Any]], event: Event) -> list[Event]:
        """The fetched events that close the gap before `event`, in order."""
        top = self._top(event)
        missed = [_from_dict(e) for e in history if self.last < int(e.get("seq", 0)) < top]
        if missed:
            self.last = missed[-1].seq
        return missed

    def accept(self, event: Event) -> bool:
        """Whether to hand `event` on: every heartbeat and step message, and each event once."""
        if event.type != "ev":
            return True
        if event.seq <= self.last:
            return False
        self.last = event.seq
        return True


def parse_telemetry(frames: list[bytes]) -> Event | None:
    """One PUB message ([topic, envelope]) as an Event; None for anything malformed."""
    if len(frames) != 2:
        return None
    try:
        env = decode(frames[1], MAX_REPLY_BYTES, from_daemon=True)
    except ProtocolError:
        return None
    return Event(env.type, env.op, env.node, env.seq, env.ts, env.body)  # an event's op is its kind


def _from_dict(event: dict[str, Any]) -> Event:
    return Event("ev", str(event.get("kind")), str(event.get("node")), int(event.get("seq", 0)),
                 float(event.get("ts", 0.0)), event)


class AsyncClient:
    """The asyncio form, for the console and for schedulers built on asyncio."""

    def __init__(self, control: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 credentials: Credentials | None = None) -> None:
        self.ctx = zmq.asyncio.Context.instance()
        self.credentials = credentials
        self.sock = _socket(self.ctx, zmq.DEALER, credentials)
        self.handshake = Handshake(control, credentials is not None)
        self.monitor = self.sock.get_monitor_socket(WATCHED)
        self.sock.connect(control)
        self.timeout_s = timeout_s
        self._waiters: dict[str, asyncio.Future[Envelope]] = {}
        self._tasks: list[asyncio.Task[None]] = []  # the reply reader and the handshake watcher

    async def call(self, op: str, timeout_s: float | None = None, **args: object) -> dict[str, Any]:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._watch())]
        if self.handshake.failure is not None:
            raise refused(self.handshake.failure)
        msg_id, frame = _request(op, args)
        limit = timeout_s or self.timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        future: asyncio.Future[Envelope] = loop.create_future()
        self._waiters[msg_id] = future  # before waiting to send: a refusal now fails it at once
        sendable = asyncio.ensure_future(self.sock.poll(int(limit * 1000) + 1, zmq.POLLOUT))  # type: ignore[call-arg]
        try:
            await asyncio.wait((sendable, future), timeout=limit, return_when=asyncio.FIRST_COMPLETED)
            if not future.done():
                if not (sendable.done() and sendable.result()):
                    raise ClientError("timeout", _UNREACHABLE.format(op=op, limit=limit), ErrorCode.TIMEOUT)
                with contextlib.suppress(zmq.Again):  # the connection went since the poll: a refusal fails `future`
                    await self.sock.send(frame, flags=zmq.NOBLOCK)
            return _unwrap(await asyncio.wait_for(future, max(deadline - loop.time(), 0.0)))
        except asyncio.TimeoutError:
            raise ClientError("timeout", f"no answer to {op!r} within {limit:.1f}s", ErrorCode.TIMEOUT) from None
        except zmq.ZMQError:
            if not self.sock.closed:
                raise
            raise ClientError("closed", CLOSED) from None
        finally:
            sendable.cancel()
            self._waiters.pop(msg_id, None)

    async def _watch(self) -> None:
        """Fail every waiting call the moment a handshake fails: no reply will ever come to tell them."""
        while True:
            failure = self.handshake.feed(await self.monitor.recv_multipart())
            for waiter in self._waiters.values():
                if failure is not None and not waiter.done():
                    waiter.set_exception(refused(failure))

    async def _read(self) -> None:
        while True:
            try:
                env = decode(await self.sock.recv(), MAX_REPLY_BYTES, from_daemon=True)
            except ProtocolError:
                continue
            waiter = self._waiters.get(env.id)
            if waiter is not None and not waiter.done():
                waiter.set_result(env)

    async def events(self, pub: str, since_seq: int | None = None, topics: tuple[str, ...] = ("",),
                     idle_timeout_s: float | None = None) -> AsyncGenerator[Event, None]:
        """Telemetry after a snapshot, like Client.subscribe: heartbeats too, gaps fetched.

        `topics` narrows the subscription (`("hb.",)` for liveness alone: without `ev.` no gap is ever seen).
        With `idle_timeout_s`, silence that long yields an `idle` event instead of waiting forever.
        """
        sub = _subscriber(self.ctx, pub, self.credentials, topics)
        watch_gaps = any("ev.".startswith(t) or t.startswith("ev.") for t in topics)
        try:
            seq = _Sequence(int((await self.call("status"))["seq"]) if since_seq is None else since_seq)
            while True:
                if idle_timeout_s is not None and not await sub.poll(int(idle_timeout_s * 1000)):
                    yield Event("idle", "idle", "", seq.last, time.time())
                    continue
                event = parse_telemetry(await sub.recv_multipart())
                if event is None:
                    continue
                if watch_gaps and seq.gap(event):
                    for item in seq.fill((await self.call("events", since_seq=seq.last, limit=0))["events"], event):
                        yield item
                if seq.accept(event):
                    yield event
        finally:
            sub.close()

    async def status(self) -> StatusReply:
        return StatusReply.decode(await self.call("status"), "status reply")

    async def metrics(self) -> list[RankRow]:
        return MetricsReply.decode(await self.call("metrics"), "metrics reply").ranks

    async def steer(self, op: str, dry_run: bool = False, force: bool = False, **args: object) -> Steered:
        return Steered.decode(await self.call(op, None, dry_run=dry_run, force=force, **args), f"{op} reply")

    def close(self) -> None:
        """Close its sockets; a call still waiting fails at once with `closed` (not at its deadline, nor with the
        socket's own error)."""
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(ClientError("closed", CLOSED))
        for task in self._tasks:
            task.cancel()
        _close(self.sock, self.monitor)
