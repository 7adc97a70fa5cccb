"""A bound ROUTER that many daemons talk to (the coordinator's mesh, a relay): read in bursts, closes watched."""

from __future__ import annotations

import asyncio
import logging

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from elasticd.keys.peer_watch import monitor_socket

log = logging.getLogger("elasticd")
# A burst of frames is read in batches: a loop turn (an epoll call) per frame cost as much as the frame;
# after this many messages the loop lets the rest of the daemon run, then reads on.
YIELD_EVERY = 16
MAX_PARTS = 4100  # a relay's batch (2,048 identity-frame pairs and its marker) and a little; more: a stranger's
# Plain ints: pyzmq's multipart helpers combine its flag enums per part, a tenth of a busy coordinator's CPU.
NOBLOCK = int(zmq.NOBLOCK)
MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)


def configure_router(sock: zmq.Socket) -> None:
    """No transport heartbeats of its own: its PINGs would arm a timeout timer per peer, and libzmq cancels a timer
    by a linear scan of all of them (poller_base's `cancel_timer`), a fifth of a 2,048-member coordinator's steady
    CPU. Peers PING it (mesh.configure_member) and its I/O thread answers with no timer; the app-level beats decide
    liveness, and the kernel's TCP keepalive reaps the half-open connection of a host that vanished."""
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 10)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 5)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a peer that reconnects reclaims its identity
    # A send to an identity with no connection fails (EHOSTUNREACH) instead of vanishing: callers can ask so.
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)


class Router:
    """Frames are read and sent on a plain (blocking-API) view of the socket, NOBLOCK: the asyncio socket's future
    per frame cost more than the frame itself at thousands of peers (a 2,048-node profile). The loop waits on
    ZeroMQ's fd only when nothing is queued (`_wait_readable`). Subclasses say what a message and a close mean."""

    def __init__(self, sock: zmq.asyncio.Socket) -> None:
        """`sock`: a configured ROUTER, not yet bound (its monitor must see every connection)."""
        self.sock = sock
        self.monitor = monitor_socket(sock, zmq.EVENT_DISCONNECTED)  # with --keys, a copy of the refusal watch's
        self.fds: dict[int, bytes] = {}  # a connection's fd -> the identity whose frames came through it
        self.raw: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        self._waiter: asyncio.Future[None] | None = None
        self._reader: tuple[asyncio.AbstractEventLoop, int] | None = None  # the loop watching ZeroMQ's fd for us

    def on_message(self, ident: bytes, parts: list[zmq.Frame]) -> None:
        raise NotImplementedError

    def on_closed(self, ident: bytes) -> None:
        """The connection that `ident`'s frames came through closed (its daemon died, or the link reset)."""

    def readable_now(self) -> bool:
        """Whether a frame waits. Asking makes ZeroMQ take in pending commands, which may use up the fd's
        edge-triggered signal: a waiting reader is woken here, or it would sleep with frames queued."""
        readable = bool(int(self.raw.get(zmq.EVENTS)) & zmq.POLLIN)
        if readable and self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        return readable

    def send_parts(self, parts: list[bytes], what: str) -> zmq.ZMQError | None:
        """One message: the identity first. None when it was queued, else why not (no route, a full queue)."""
        try:  # the identity part fails alone; once it is taken the rest follows
            last = len(parts) - 1
            for i, part in enumerate(parts):
                self.raw.send(part, NOBLOCK if i == last else MORE_NOBLOCK)
        except zmq.ZMQError as error:  # a peer's queue is full or gone: liveness and resends sort it out
            log.debug("send of %s to %r dropped: %s", what, parts[0], error)
            return error
        finally:
            if self._waiter is not None:  # sent from outside the read loop, which sleeps on the fd
                self.readable_now()
        return None

    async def serve_router(self) -> None:
        await asyncio.gather(self._receive(), self._watch())

    async def _watch(self) -> None:
        while True:
            event = await recv_monitor_message(self.monitor)
            ident = self.fds.pop(event["value"], None)
            if event["event"] != zmq.EVENT_DISCONNECTED or ident is None:
                continue
            try:
                self.on_closed(ident)
            except Exception as exc:
                log.warning("closed connection of %r failed: %r", ident, exc)

    async def _wait_readable(self) -> None:
        """Sleep until a frame waits: on ZeroMQ's fd, which signals changes, so the state is asked first."""
        loop = asyncio.get_running_loop()
        fd = int(self.raw.get(zmq.FD))
        self._waiter = loop.create_future()
        loop.add_reader(fd, self.readable_now)
        self._reader = (loop, fd)
        try:
            if not self.readable_now():
                await self._waiter
        finally:
            self._unwatch()

    def _unwatch(self) -> None:
        if self._reader is not None:
            loop, fd = self._reader
            loop.remove_reader(fd)
            self._reader = self._waiter = None

    async def _receive(self) -> None:
        while True:
            for _ in range(YIELD_EVERY):
                try:
                    ident = self.raw.recv(NOBLOCK)
                except zmq.Again:
                    break
                parts = [self.raw.recv(0, copy=False)]  # a message arrives whole: its parts are all queued
                while parts[-1].more and len(parts) < MAX_PARTS:
                    parts.append(self.raw.recv(0, copy=False))
                if parts[-1].more:  # longer than any batch: a stranger's message, dropped, all of it
                    while self.raw.recv(0, copy=False).more:
                        pass
                    continue
                self.fds[_source_fd(parts[0])] = ident
                try:
                    self.on_message(ident, parts)
                except Exception as exc:  # one message must never end the loop every peer depends on
                    log.warning("a message from %r failed: %r", ident, exc)
            else:
                await asyncio.sleep(0)  # never starve the rest of the daemon, whatever arrives
                continue
            await self._wait_readable()

    def close(self) -> None:
        self._unwatch()  # before the socket goes: its fd may signal once more
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close()


def node_of(ident: bytes) -> str:
    return ident.decode(errors="replace").split("|", 1)[0]  # a DEALER's identity is `node_id|instance`


def _source_fd(frame: zmq.Frame) -> int:
    """The fd of the connection a frame came through (deprecated in libzmq for `Peer-Address`, still kept)."""
    try:
        return int(frame.get(zmq.SRCFD))
    except zmq.ZMQError:
        return -1
