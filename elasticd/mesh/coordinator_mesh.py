"""Daemon-to-daemon transport, the coordinator's side: its ROUTER on the rendezvous endpoint, relays' batches."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from elasticd.keys.auth import NodeKeys, serve_curve
from elasticd.mesh.router import Router, configure_router, node_of
from elasticd.wire.assignment import Welcome
from elasticd.wire.names import RELAY_DOWN, RELAY_MANY, RELAY_UP, MeshOp
from elasticd.wire.protocol import MAX_REPLY_BYTES, Envelope, ProtocolError, decode, encode

log = logging.getLogger("elasticd")
Handler = Callable[[str, Envelope], None]  # (sender node id, message)
Closed = Callable[[str], None]  # the node id whose welcomed daemon's connection closed
RELAY_BATCH = 2048  # identity-frame pairs in one batch to a relay at most (router.MAX_PARTS takes one)
Pending = list[tuple[bytes, bytes | list[bytes]]]  # a relay's queued frames: (frame, identity or identities)


class CoordinatorMesh(Router):
    """Binds the rendezvous endpoint; one DEALER per member node talks to it, directly or through its relay."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, node_id: str, keys: NodeKeys | None) -> None:
        sock = ctx.socket(zmq.ROUTER)
        configure_router(sock)
        if keys is not None:
            serve_curve(sock, keys.secret, keys.public, "mesh")
        super().__init__(sock)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError:
            self.close()  # not left to the garbage collector: the context's term would wait on an open socket
            raise
        self.node_id = node_id
        self.identities: dict[str, bytes] = {}  # node id -> the identity of its *welcomed* daemon
        self.registering: bytes = b""  # the identity of the `register` being handled right now
        # The relay the coordinator assigned a member ("": none); a relay's frame for any other member is dropped.
        self.relay_of: Callable[[str], str] = lambda _node_id: ""  # route_by: the coordinator's relay plan
        self.routes: dict[bytes, bytes] = {}  # a member's identity -> its relay's: where its last frame came from
        self.quiet: set[bytes] = set()  # relayed members whose link their relay saw close
        self.pending: dict[bytes, Pending] = {}  # relay identity -> frames for its members, sent at the turn's end
        self.handler: Handler = lambda _sender, _env: None
        self.closed: Closed = lambda _node_id: None

    def route_by(self, relay_of: Callable[[str], str]) -> None:
        """A new coordinator's relay plan: which relay each member's frames must come through ("": none)."""
        self.relay_of = relay_of

    def forget(self) -> None:
        """Every member must register again (a new coordinator after a takeover): no route survives."""
        self.identities, self.fds, self.routes, self.quiet, self.pending = {}, {}, {}, set(), {}

    def send(self, node_id: str, op: str, body: dict[str, Any], kind: str = "req", msg_id: str = "") -> None:
        if op == MeshOp.welcome:  # answers the `register` being handled; only a welcome makes its daemon the route
            if Welcome.decode(body, op).ok:
                self.identities[node_id] = self.registering
            self._send_frame(self.registering, op, self._encode(op, body, kind, msg_id))
            return
        ident = self.identities.get(node_id)
        if ident is not None:
            self._send_frame(ident, op, self._encode(op, body, kind, msg_id))

    def send_all(self, node_ids: list[str], op: str, body: dict[str, Any]) -> None:
        """The same message to many members (`go`, `step_query`...): encoded once; a relay gets it once, with the
        identities of its members it is for."""
        frame = self._encode(op, body, "req", "")
        for node_id in node_ids:
            ident = self.identities.get(node_id)
            if ident is None:
                continue
            relay = self.routes.get(ident)
            if relay is None:
                self.send_parts([ident, frame], op)
                continue
            queued = self._queue(relay)
            if queued and queued[-1][0] is frame and isinstance(queued[-1][1], list):
                queued[-1][1].append(ident)
            else:
                queued.append((frame, [ident]))

    def _encode(self, op: str, body: dict[str, Any], kind: str, msg_id: str) -> bytes:
        return encode(Envelope(kind, op, body, id=msg_id, node=self.node_id, ts=time.time()))

    def _send_frame(self, ident: bytes, op: str, frame: bytes) -> zmq.ZMQError | None:
        relay = self.routes.get(ident)
        if relay is None:
            return self.send_parts([ident, frame], op)
        self._queue(relay).append((frame, ident))
        return None

    def _queue(self, relay: bytes) -> Pending:
        """A relay's frames go out together when this loop turn ends: a round's `round` to 32 members is one message."""
        if not self.pending:
            with contextlib.suppress(RuntimeError):  # no loop (closing): dropped, as a full queue would drop it
                asyncio.get_running_loop().call_soon(self.flush)
        return self.pending.setdefault(relay, [])

    def flush(self) -> None:
        """Each relay's queue in order: runs of single frames as `relay-down`, a shared frame as `relay-many`."""
        pending, self.pending = self.pending, {}
        for relay, queued in pending.items():
            pairs: list[bytes] = []
            for frame, target in queued:
                if isinstance(target, bytes):
                    pairs += [target, frame]
                    if len(pairs) < 2 * RELAY_BATCH:
                        continue
                if pairs:
                    self.send_parts([relay, RELAY_DOWN, *pairs], "relay-down")
                    pairs = []
                if isinstance(target, list):
                    for start in range(0, len(target), RELAY_BATCH):
                        self.send_parts([relay, RELAY_MANY, frame, *target[start:start + RELAY_BATCH]], "relay-many")
            if pairs:
                self.send_parts([relay, RELAY_DOWN, *pairs], "relay-down")

    def backlog(self) -> bool:
        """Frames from members wait to be read (a burst): liveness is judged only once they are."""
        return self.readable_now()

    def connected(self, node_id: str) -> bool:
        """Whether the node's welcomed daemon has a live link now: a no-op `hb` to it (or to its relay, an empty
        batch) is routed, and its relay did not see its link close."""
        ident = self.identities.get(node_id)
        if ident is None:
            return False
        relay = self.routes.get(ident)
        if relay is not None:
            return ident not in self.quiet and _routed(self.send_parts([relay, RELAY_DOWN], "probe"))
        return _routed(self.send_parts([ident, self._encode(MeshOp.hb, {}, "req", "")], "probe"))

    async def serve(self, handler: Handler, on_closed: Closed) -> None:
        self.handler, self.closed = handler, on_closed
        await self.serve_router()

    def on_closed(self, ident: bytes) -> None:
        """A welcomed daemon's connection closed; a relay's members go direct until their frames say otherwise."""
        node_id = node_of(ident)
        if self.identities.get(node_id) != ident:
            return  # not the connection of a welcomed daemon: a stranger, a refused duplicate, a stale one
        if ident in self.routes:
            return  # the direct link it left for its relay: it still talks to us, through the relay
        for member in [m for m, relay in self.routes.items() if relay == ident]:
            del self.routes[member]
        self.closed(node_id)

    def on_message(self, ident: bytes, parts: list[zmq.Frame]) -> None:
        if len(parts) == 1:
            self._one(ident, node_of(ident), parts[0], relayed=False)
        elif parts[0].bytes == RELAY_UP:
            self._relayed(ident, parts)
        # anything else: a stranger's message

    def _relayed(self, relay_ident: bytes, parts: list[zmq.Frame]) -> None:
        """A relay's batch: each frame is its member's own, taken only from the relay assigned to that member."""
        relay = node_of(relay_ident)
        identities, relay_of, routes = self.identities, self.relay_of, self.routes
        if identities.get(relay) != relay_ident:
            return  # not a welcomed daemon
        for i in range(1, len(parts) - 1, 2):
            ident = parts[i].bytes
            node_id = node_of(ident)
            if relay_of(node_id) != relay or identities.get(node_id) != ident:
                continue  # not this relay's member, or not its welcomed daemon
            frame = parts[i + 1]
            if not len(frame.buffer):  # its link to the relay closed
                if routes.get(ident) == relay_ident:
                    self.quiet.add(ident)
                    self.closed(node_id)
                continue
            routes[ident] = relay_ident
            self.quiet.discard(ident)  # it speaks again: a link that closed came back
            self._one(ident, node_id, frame, relayed=True)

    def _one(self, ident: bytes, sender: str, frame: zmq.Frame, relayed: bool) -> None:
        try:
            env = decode(frame.bytes, MAX_REPLY_BYTES)  # forwarded requests are a little over the request cap
        except ProtocolError as exc:
            log.warning("mesh: dropped a bad frame: %s", exc.reason)
            return
        if env.node != sender:
            return  # a node speaks only for itself
        if env.op == MeshOp.register:
            self.registering = ident
        elif env.op != MeshOp.announce and self.identities.get(sender) != ident:
            return  # not the welcomed daemon of that node: a refused duplicate, or a stale instance
        if not relayed and ident in self.routes:  # it talks to us directly again (its relay went, or it was told)
            del self.routes[ident]
            self.quiet.discard(ident)
        try:
            self.handler(sender, env)
        except Exception as exc:  # one frame must never end the loop every member depends on
            log.warning("mesh: %r from %s failed: %r", env.op, sender, exc)


def _routed(error: zmq.ZMQError | None) -> bool:
    return error is None or error.errno != zmq.EHOSTUNREACH  # EAGAIN: its queue is full, but it is there
