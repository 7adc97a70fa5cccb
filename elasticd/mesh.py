"""Daemon-to-daemon transport: the coordinator's ROUTER on the rendezvous endpoint, members' DEALERs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from elasticd.auth import NodeKeys, connect_curve, serve_curve
from elasticd.names import MeshOp
from elasticd.protocol import MAX_REPLY_BYTES, Envelope, ProtocolError, decode, encode

log = logging.getLogger("elasticd")
Handler = Callable[[str, Envelope], None]  # (sender node id, message)
Closed = Callable[[str], None]  # the node id whose welcomed daemon's connection closed
# A burst of member frames is read in batches: a loop turn (an epoll call) per frame cost as much as the frame;
# after this many the loop lets the rest of the daemon run, then reads on.
YIELD_EVERY = 16
# Plain ints: pyzmq's multipart helpers combine its flag enums per part, a tenth of a busy coordinator's CPU.
NOBLOCK = int(zmq.NOBLOCK)
MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)


def configure_member(sock: zmq.Socket) -> None:
    """A member's DEALER: ZeroMQ's transport heartbeats tell it whether the coordinator's process holds the link.

    Only members send them. The coordinator answers a PING in its I/O thread with no timer of its own; its own PINGs
    would arm a timeout timer per member, and libzmq cancels a timer by a linear scan of all of them (poller_base's
    `cancel_timer`): at 2,048 members that scan was a fifth of the coordinator's steady CPU.
    """
    sock.setsockopt(zmq.LINGER, 500)
    sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)


def _configure_coordinator(sock: zmq.Socket) -> None:
    """The coordinator's ROUTER: no transport heartbeats (above); the app-level beats decide liveness, and the
    kernel's TCP keepalive reaps the half-open connection of a host that vanished (no timer in ZeroMQ)."""
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 10)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 5)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)


class CoordinatorMesh:
    """Binds the rendezvous endpoint; one DEALER per member node talks to it."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, node_id: str, keys: NodeKeys | None) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        _configure_coordinator(self.sock)
        if keys is not None:
            serve_curve(self.sock, keys.secret, keys.public, "mesh")
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a member that reconnects reclaims its identity
        # A send to an identity with no connection fails (EHOSTUNREACH) instead of vanishing: `connected` asks so.
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.sock.bind(endpoint)
        self.node_id = node_id
        self.identities: dict[str, bytes] = {}  # node id -> the identity of its *welcomed* daemon
        self.registering: bytes = b""  # the identity of the `register` being handled right now
        self.fds: dict[int, bytes] = {}  # a connection's fd -> the identity whose frames came through it
        # Frames are read and sent on a plain (blocking-API) view of the same socket, NOBLOCK: the asyncio
        # socket's future per frame cost more than the frame itself at thousands of members (a 2,048-node
        # profile). The loop waits on ZeroMQ's fd only when nothing is queued (`_wait_readable`).
        self.raw: zmq.Socket[bytes] = zmq.Socket.shadow(self.sock.underlying)
        self._waiter: asyncio.Future[None] | None = None

    def send(self, node_id: str, op: str, body: dict[str, Any], kind: str = "req", msg_id: str = "") -> None:
        if op == MeshOp.welcome:  # answers the `register` being handled; only a welcome makes its daemon the route
            if body.get("ok"):
                self.identities[node_id] = self.registering
            self._send_to(self.registering, op, body, kind, msg_id)
            return
        ident = self.identities.get(node_id)
        if ident is not None:
            self._send_to(ident, op, body, kind, msg_id)

    def send_all(self, node_ids: list[str], op: str, body: dict[str, Any]) -> None:
        """The same message to many members (`go`, `step_query`...): encoded once, the same bytes to each."""
        frame = encode(Envelope("req", op, body, node=self.node_id, ts=time.time()))
        for node_id in node_ids:
            ident = self.identities.get(node_id)
            if ident is not None:
                self._send_frame(ident, op, frame)

    def backlog(self) -> bool:
        """Frames from members wait to be read (a burst): liveness is judged only once they are."""
        return self._readable_now()

    def _readable_now(self) -> bool:
        """Whether a frame waits. Asking makes ZeroMQ take in pending commands, which may use up the fd's
        edge-triggered signal: a waiting reader is woken here, or it would sleep with frames queued."""
        readable = bool(int(self.raw.get(zmq.EVENTS)) & zmq.POLLIN)
        if readable and self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        return readable

    def connected(self, node_id: str) -> bool:
        """Whether the node's welcomed daemon has a live connection now: a no-op `hb` to it is routed."""
        ident = self.identities.get(node_id)
        if ident is None:
            return False
        error = self._send_to(ident, MeshOp.hb, {}, "req", "")
        return error is None or error.errno != zmq.EHOSTUNREACH  # EAGAIN: its queue is full, but it is there

    def _send_to(self, ident: bytes, op: str, body: dict[str, Any], kind: str, msg_id: str) -> zmq.ZMQError | None:
        return self._send_frame(ident, op, encode(Envelope(kind, op, body, id=msg_id, node=self.node_id,
                                                           ts=time.time())))

    def _send_frame(self, ident: bytes, op: str, frame: bytes) -> zmq.ZMQError | None:
        try:  # the identity part fails alone (no route, a full queue); once it is taken the frame follows
            self.raw.send(ident, MORE_NOBLOCK)
            self.raw.send(frame, NOBLOCK)
        except zmq.ZMQError as error:  # a member's queue is full or gone: liveness and resends sort it out
            log.debug("mesh send of %s to %r dropped: %s", op, ident, error)
            return error
        finally:
            if self._waiter is not None:  # sent from outside the read loop, which sleeps on the fd
                self._readable_now()
        return None

    async def serve(self, handler: Handler, on_closed: Closed) -> None:
        await asyncio.gather(self._receive(handler), self._watch(on_closed))

    async def _watch(self, on_closed: Closed) -> None:
        """A welcomed member's connection closed (its daemon died, or the link reset): tell the coordinator."""
        while True:
            event = await recv_monitor_message(self.monitor)
            ident = self.fds.pop(event["value"], None)
            node_id = _node_of(ident or b"")
            if event["event"] != zmq.EVENT_DISCONNECTED or ident is None or self.identities.get(node_id) != ident:
                continue  # not the connection of a welcomed daemon: a stranger, a refused duplicate, a stale one
            try:
                on_closed(node_id)
            except Exception as exc:
                log.warning("mesh: closed connection of %s failed: %r", node_id, exc)

    async def _wait_readable(self) -> None:
        """Sleep until a frame waits: on ZeroMQ's fd, which signals changes, so the state is asked first."""
        loop = asyncio.get_running_loop()
        fd = int(self.raw.get(zmq.FD))
        self._waiter = loop.create_future()
        loop.add_reader(fd, self._readable_now)
        try:
            if not self._readable_now():
                await self._waiter
        finally:
            loop.remove_reader(fd)
            self._waiter = None

    async def _receive(self, handler: Handler) -> None:
        while True:
            for _ in range(YIELD_EVERY):
                try:
                    ident = self.raw.recv(NOBLOCK)
                except zmq.Again:
                    break
                frame = self.raw.recv(0, copy=False)  # a message arrives whole: its parts are all queued
                if frame.more:  # a stranger's frame of three parts or more: dropped, all of it
                    while self.raw.recv(0, copy=False).more:
                        pass
                    continue
                self._one(ident, frame, handler)
            else:
                await asyncio.sleep(0)  # never starve the rest of the daemon, whatever arrives
                continue
            await self._wait_readable()

    def _one(self, ident: bytes, frame: zmq.Frame, handler: Handler) -> None:
        self.fds[_source_fd(frame)] = ident
        try:
            env = decode(frame.bytes, MAX_REPLY_BYTES)  # forwarded requests are a little over the request cap
        except ProtocolError as exc:
            log.warning("mesh: dropped a bad frame: %s", exc.reason)
            return
        sender = _node_of(ident)
        if env.node != sender:
            return  # a node speaks only for itself
        if env.op == MeshOp.register:
            self.registering = ident
        elif env.op != MeshOp.announce and self.identities.get(sender) != ident:
            return  # not the welcomed daemon of that node: a refused duplicate, or a stale instance
        try:
            handler(sender, env)
        except Exception as exc:  # one frame must never end the loop every member depends on
            log.warning("mesh: %r from %s failed: %r", env.op, sender, exc)

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close()


def _node_of(ident: bytes) -> str:
    return ident.decode(errors="replace").split("|", 1)[0]  # a DEALER's identity is `node_id|instance`


def _source_fd(frame: zmq.Frame) -> int:
    """The fd of the connection a frame came through (deprecated in libzmq for `Peer-Address`, still kept)."""
    try:
        return int(frame.get(zmq.SRCFD))
    except zmq.ZMQError:
        return -1


class MemberMesh:
    """A member's link to the coordinator."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, node_id: str, instance: str,
                 keys: NodeKeys | None) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        configure_member(self.sock)
        if keys is not None:  # daemons of one job share the node key pair: each proves it holds it
            connect_curve(self.sock, keys.secret, keys.public, keys.public)
        self.sock.setsockopt(zmq.IDENTITY, f"{node_id}|{instance}".encode())
        self.sock.setsockopt(zmq.SNDHWM, 10000)
        # Whether the coordinator's process holds our connection: its ZeroMQ I/O thread answers the transport
        # heartbeats even while its loop is starved, and a dead, frozen or cut-off one drops the link (3 s).
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.link_up = False
        self.sock.connect(endpoint)
        self.node_id = node_id

    async def _watch_link(self) -> None:
        while True:
            event = await recv_monitor_message(self.monitor)
            self.link_up = event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED

    def backlog(self) -> bool:
        """Frames from the coordinator wait to be read: its silence is judged only once they are."""
        return bool(int(self.sock.get(zmq.EVENTS)) & zmq.POLLIN)  # pyzmq re-arms its wakeup on `get`

    def send(self, op: str, body: dict[str, Any], kind: str = "req", msg_id: str = "") -> None:
        frame = encode(Envelope(kind, op, body, id=msg_id, node=self.node_id, ts=time.time()))
        try:
            self.sock.send(frame, flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("mesh send %s dropped: %s", op, exc)

    async def serve(self, handler: Handler) -> None:
        await asyncio.gather(self._receive(handler), self._watch_link())

    async def _receive(self, handler: Handler) -> None:
        while True:
            payload = await self.sock.recv()
            try:
                env = decode(payload, MAX_REPLY_BYTES)  # forwarded replies can be large
            except ProtocolError as exc:
                log.warning("mesh: dropped a bad frame from the coordinator: %s", exc.reason)
                continue
            try:
                handler(env.node, env)
            except Exception as exc:
                log.warning("mesh: %r from the coordinator failed: %r", env.op, exc)
            await asyncio.sleep(0)

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close()
