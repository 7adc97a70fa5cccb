"""A member that relays for a group of others (large jobs): their frames reach the coordinator in batches, and back.

The relay reads nothing it forwards: the coordinator decodes and judges every member's frame, as if it had come
directly (docs/architecture.md, "Relays").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import zmq
import zmq.asyncio

from elasticd.job.runtime import bind_in_range
from elasticd.keys.auth import NodeKeys, serve_curve
from elasticd.mesh.coordinator_mesh import RELAY_BATCH
from elasticd.mesh.router import Router, configure_router
from elasticd.wire.names import RELAY_DOWN, RELAY_MANY, RELAY_UP

log = logging.getLogger("elasticd")
Upstream = Callable[[list[bytes]], bool]  # a batch to the coordinator (member_mesh.py `MemberMesh.send_parts`)
# A heartbeat waits at most this long for others to travel with (one message to the coordinator for several
# members' beats); anything else goes when the loop turn ends. Well inside the 3 s loss limit.
BEAT_HOLD_S = 0.2
_BEAT = b'"op":"hb"'


class Relay(Router):
    """Bound by every daemon of a job with relays; the coordinator names which ones relay, and for whom."""

    def __init__(self, ctx: zmq.asyncio.Context, host: str, keys: NodeKeys | None,
                 port_range: tuple[int, int] | None, upstream: Upstream) -> None:
        sock = ctx.socket(zmq.ROUTER)
        configure_router(sock)
        sock.setsockopt(zmq.LINGER, 0)
        if keys is not None:  # as the coordinator's mesh: only holders of the job's node key get in
            serve_curve(sock, keys.secret, keys.public, "mesh")
        super().__init__(sock)
        self.endpoint = bind_in_range(sock, host, port_range, "the relay")
        self.upstream = upstream
        self.batch: list[bytes] = []  # identity, frame, identity, frame...
        self.flush_at: asyncio.TimerHandle | asyncio.Handle | None = None
        self.urgent = False  # the batch holds more than heartbeats: it goes at the turn's end

    def on_message(self, ident: bytes, parts: list[zmq.Frame]) -> None:
        if len(parts) != 1:
            return  # members send single frames
        frame = parts[0].bytes
        if not frame:
            return  # an empty frame means "closed" upstream: never a member's to send
        self.batch += [ident, frame]
        self._flush_soon(urgent=_BEAT not in frame[:64])

    def on_closed(self, ident: bytes) -> None:
        self.batch += [ident, b""]
        self._flush_soon(urgent=True)

    def deliver(self, parts: list[bytes]) -> None:
        """The coordinator's batch: frames for our members, each to its identity (one gone is dropped: the
        coordinator asks again what matters)."""
        if parts[0] == RELAY_DOWN:
            for i in range(1, len(parts) - 1, 2):
                self.send_parts([parts[i], parts[i + 1]], "relayed frame")
        elif parts[0] == RELAY_MANY and len(parts) > 1:
            frame = parts[1]
            for ident in parts[2:]:
                self.send_parts([ident, frame], "relayed frame")

    def _flush_soon(self, urgent: bool) -> None:
        loop = asyncio.get_running_loop()
        if urgent and not self.urgent:
            self.urgent = True
            if self.flush_at is not None:
                self.flush_at.cancel()
            self.flush_at = loop.call_soon(self.flush)
        elif self.flush_at is None:
            self.flush_at = loop.call_later(BEAT_HOLD_S, self.flush)

    def flush(self) -> None:
        batch, self.batch, self.flush_at, self.urgent = self.batch, [], None, False
        for start in range(0, len(batch), 2 * RELAY_BATCH):
            if not self.upstream([RELAY_UP, *batch[start:start + 2 * RELAY_BATCH]]):
                log.debug("relay: a batch of %d frames could not go to the coordinator", len(batch) // 2)

    async def serve(self) -> None:
        await self.serve_router()
