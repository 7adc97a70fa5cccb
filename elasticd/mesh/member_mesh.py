"""A member's link to the coordinator: one DEALER to it, or to the relay it was given, and a switch between the two."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, cast

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from elasticd.keys.auth import NodeKeys, connect_curve
from elasticd.wire.names import RELAY_DOWN, RELAY_MANY
from elasticd.wire.protocol import MAX_REPLY_BYTES, Envelope, ProtocolError, decode, encode

log = logging.getLogger("elasticd")
Handler = Callable[[str, Envelope], None]  # (sender node id, message)
Batch = Callable[[list[bytes]], None]  # a relay's batch from the coordinator (relay.py `Relay.deliver`)
RELAY_CONNECT_S = 3.0  # a relay not reached in this long: the member stays direct and says so (`via_failed`)
RETIRE_S = 2.0  # a link left behind is still read this long: what was already on its way still arrives


def configure_member(sock: zmq.Socket) -> None:
    """A member's DEALER: ZeroMQ's transport heartbeats tell it whether the peer's process holds the link (the
    coordinator's or relay's I/O thread answers them while its loop is starved; a dead or frozen one drops it).
    Only members send them: see router.configure_router."""
    sock.setsockopt(zmq.LINGER, 500)
    sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)


class Link:
    """One DEALER, to the coordinator or to a relay, with whether its connection is up."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, identity: bytes, keys: NodeKeys | None) -> None:
        self.endpoint = endpoint
        self.sock = ctx.socket(zmq.DEALER)
        configure_member(self.sock)
        if keys is not None:  # daemons of one job share the node key pair: each proves it holds it
            connect_curve(self.sock, keys.secret, keys.public, keys.public)
        self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.setsockopt(zmq.SNDHWM, 10000)
        self.monitor = self.sock.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.up = False
        self.accepted = False  # something at the endpoint took our TCP connection, whatever it speaks
        self.tasks: list[asyncio.Task[None]] = []
        self.sock.connect(endpoint)

    def send(self, parts: list[bytes]) -> bool:
        """Queued at once or not at all (NOBLOCK): an asyncio socket says which in the future it returns, which is
        done already; a full queue or a closed socket is read from it here, not left to be logged as unretrieved."""
        if self.sock.closed:
            return False
        sent = cast("asyncio.Future[Any]", self.sock.send_multipart(parts, flags=zmq.NOBLOCK))
        error = sent.exception() if sent.done() else None
        if error is not None:
            log.debug("mesh: a message of %d parts to %s dropped: %s", len(parts), self.endpoint, error)
        return error is None

    def readable(self) -> bool:
        return bool(int(self.sock.get(zmq.EVENTS)) & zmq.POLLIN)  # pyzmq re-arms its wakeup on `get`

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close()


class MemberMesh:
    """Frames go out on one link: to the coordinator, or to the relay the coordinator named (`route`). A relay link
    is taken once it is up, and left for the coordinator at once when it drops."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, node_id: str, instance: str,
                 keys: NodeKeys | None) -> None:
        self.ctx, self.coordinator, self.keys = ctx, endpoint, keys
        self.node_id = node_id
        self.identity = f"{node_id}|{instance}".encode()
        self.via = ""  # the relay endpoint `link` goes to; "": the coordinator
        self.via_failed = ""  # a relay endpoint this member could not reach (its heartbeats say so)
        self.pending: Link | None = None  # a relay link not yet up
        self.retiring: list[Link] = []
        self.handler: Handler | None = None
        self.on_batch: Batch = lambda _parts: None
        self.on_switched: Callable[[], None] = lambda: None  # the member speaks on its new link at once
        self.on_coordinator_down: Callable[[], None] = lambda: None  # our direct link to the coordinator dropped
        self.done = asyncio.Event()
        self.link = self._open(endpoint)

    @property
    def link_up(self) -> bool:
        """Whether the peer's process holds our connection: slow is not gone (member.py `coordinator_gone`)."""
        return self.link.up

    def foreign(self) -> bool:
        """Whether a program at the coordinator's endpoint took our connection but never answered as ZeroMQ peer
        of ours: another program on that port, or --keys on one side only."""
        return self.link.accepted and not self.link.up and not self.via

    def backlog(self) -> bool:
        """Frames wait to be read on some link: silence is judged only once they are."""
        return any(link.readable() for link in self._links())

    def send(self, op: str, body: dict[str, Any], kind: str = "req", msg_id: str = "") -> None:
        self.link.send([encode(Envelope(kind, op, body, id=msg_id, node=self.node_id, ts=time.time()))])

    def send_parts(self, parts: list[bytes]) -> bool:
        """A relay's batch to the coordinator (a relay always talks to it directly)."""
        return self.link.send(parts)

    def route(self, via: str) -> None:
        """Send through the relay at `via` from now on ("": the coordinator itself)."""
        if self.pending is not None and self.pending.endpoint != via:
            self.pending.close()
            self.pending = None
        if via == self.via or (self.pending is not None and self.pending.endpoint == via):
            return
        if not via:
            self._switch(self._open(self.coordinator), "")
            return
        self.pending = self._open(via)
        with contextlib.suppress(RuntimeError):  # (no loop: a test that never serves)
            asyncio.get_running_loop().call_later(RELAY_CONNECT_S, self._give_up, self.pending)

    def state(self) -> dict[str, str]:
        """For the heartbeat: the relay frames go through, and one that could not be reached."""
        return {"via": self.via, **({"via_failed": self.via_failed} if self.via_failed else {})}

    async def serve(self, handler: Handler) -> None:
        self.handler = handler
        for link in self._links():
            self._start(link)
        await self.done.wait()

    def close(self) -> None:
        for link in self._links():
            link.close()
        self.retiring, self.pending = [], None
        self.done.set()

    # ---- links ------------------------------------------------------------------------------------
    def _links(self) -> list[Link]:
        """Every open link: the one we send on, those left behind, and a relay's not yet up."""
        return [self.link, *self.retiring, *([self.pending] if self.pending is not None else [])]

    def _open(self, endpoint: str) -> Link:
        link = Link(self.ctx, endpoint, self.identity, self.keys)
        if self.handler is not None:
            self._start(link)
        return link

    def _start(self, link: Link) -> None:
        if not link.tasks:
            link.tasks = [asyncio.create_task(self._receive(link)), asyncio.create_task(self._watch(link))]

    def _switch(self, link: Link, via: str) -> None:
        old, self.link, self.via = self.link, link, via
        if via:
            self.via_failed = ""
        self.retiring.append(old)
        asyncio.get_running_loop().call_later(RETIRE_S, self._retire, old)
        log.info("mesh: node %s now sends through %s", self.node_id, via or f"no relay ({self.coordinator})")
        self.on_switched()

    def _retire(self, link: Link) -> None:
        if link in self.retiring:
            self.retiring.remove(link)
            link.close()

    def _give_up(self, link: Link) -> None:
        if link is self.pending and not link.up:
            log.warning("mesh: relay %s not reached in %.0fs; node %s talks to the coordinator directly",
                        link.endpoint, RELAY_CONNECT_S, self.node_id)
            self.pending, self.via_failed = None, link.endpoint
            link.close()

    async def _watch(self, link: Link) -> None:
        while True:
            event = await recv_monitor_message(link.monitor)
            if event["event"] == zmq.EVENT_CONNECTED:  # TCP only: the handshake says whether an elasticd answered
                link.accepted = True
                continue
            link.up = event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
            if link.up and link is self.pending:
                self.pending = None
                self._switch(link, link.endpoint)
            elif not link.up and link is self.link and self.via:  # the relay went: straight to the coordinator
                log.warning("mesh: relay %s dropped node %s's link; talking to the coordinator directly", self.via,
                            self.node_id)
                self._switch(self._open(self.coordinator), "")
            elif not link.up and link is self.link:
                self.on_coordinator_down()

    async def _receive(self, link: Link) -> None:
        while True:
            parts = await link.sock.recv_multipart()
            if parts[0] in (RELAY_DOWN, RELAY_MANY):  # a relay batch: only ever from the coordinator
                if link.endpoint == self.coordinator:
                    self.on_batch(parts)
                continue
            if len(parts) > 1:
                continue  # no one else sends more than one part
            try:
                env = decode(parts[0], MAX_REPLY_BYTES)  # forwarded replies can be large
            except ProtocolError as exc:
                log.warning("mesh: dropped a bad frame from %s: %s", link.endpoint, exc.reason)
                continue
            try:
                assert self.handler is not None
                self.handler(env.node, env)
            except Exception as exc:
                log.warning("mesh: %r from the coordinator failed: %r", env.op, exc)
            await asyncio.sleep(0)
