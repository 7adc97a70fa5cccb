"""The store tunnel: other nodes' workers reach the round's loopback c10d store through the daemons, over CURVE.

Contract (docs/protocol.md §9.3). Each keyed daemon binds one ROUTER, `TunnelServer` (CURVE with the job's node
key, ZAP domain `mesh`, a port from --port-range), and names it in `register`; a round's assignment carries the
master node's. For each round:
- the master node's daemon says where that round's store host listens (`host_round`); each stream opened for the
  round is connected to that 127.0.0.1 port, and a stream opened first waits up to STORE_WAIT_S for it;
- every other node's daemon runs a `RoundRelay`: a 127.0.0.1 listener (the workers' MASTER_PORT) and a DEALER to
  the master's tunnel; each accepted connection becomes one stream there.
Frames on the DEALER: [op, round, stream id, bytes] (ASCII decimals; `open` and `close` carry no bytes); the
ROUTER sees the peer's identity in front. A `close`, or an EOF on either side, closes the other side.
`close_round` / `RoundRelay.close` end every stream of the round; the server refuses later opens for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import zmq
import zmq.asyncio

from elasticd.job.runtime import bind_in_range
from elasticd.keys.auth import NodeKeys, connect_curve, serve_curve
from elasticd.wire.names import TunnelOp

log = logging.getLogger("elasticd")
LOOPBACK = "127.0.0.1"
STORE_WAIT_S = 30.0  # how long a stream waits for its round's store host (the master starts it at `go`, in ms)
CHUNK = 1 << 16
Send = Callable[[TunnelOp, bytes], Awaitable[None]]


def _configure(sock: zmq.Socket) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    # No high-water mark: a dropped `data` frame would corrupt a stream, and the store's request/response
    # protocol keeps little in flight per stream anyway.
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)


def frames(op: TunnelOp, round_id: int, stream_id: int, data: bytes = b"") -> list[bytes]:
    return [op.encode(), str(round_id).encode(), str(stream_id).encode(), data]


def parse(parts: list[bytes]) -> tuple[TunnelOp, int, int, bytes] | None:
    """[op, round, stream, bytes] from a peer we authenticated; None for anything else."""
    if len(parts) != 4:
        return None
    try:
        return TunnelOp(parts[0].decode()), int(parts[1]), int(parts[2]), parts[3]
    except ValueError:
        return None


class Stream:
    """One relayed TCP connection; bytes that arrive before its socket is connected wait in `pending`."""

    def __init__(self, round_id: int) -> None:
        self.round_id = round_id
        self.writer: asyncio.StreamWriter | None = None
        self.pending: list[bytes] = []
        self.closed = False
        self.task: asyncio.Task[None] | None = None

    def deliver(self, data: bytes) -> None:
        # No drain: this runs in the tunnel's receive loop, and store messages are small.
        if self.writer is None:
            self.pending.append(data)
        else:
            self.writer.write(data)

    def attach(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        for data in self.pending:
            writer.write(data)
        self.pending.clear()
        if self.closed:
            writer.close()

    def close(self) -> None:
        self.closed = True
        if self.writer is not None:
            self.writer.close()

    def cancel(self) -> None:
        self.close()
        if self.task is not None:
            self.task.cancel()


async def pump(reader: asyncio.StreamReader, stream: Stream, send: Send) -> None:
    """TCP to tunnel until EOF; then `close` to the other side, unless it closed first."""
    with contextlib.suppress(OSError):
        while data := await reader.read(CHUNK):
            await send(TunnelOp.data, data)
    if not stream.closed:
        stream.close()
        await send(TunnelOp.close, b"")


JOB_STORE = 0  # the tunnel's id for the job's long-lived store (in-place resizes); rounds count from 1


class TunnelServer:
    """The ROUTER every keyed daemon binds; it relays streams to this node's store host when it is the master."""

    def __init__(self, ctx: zmq.asyncio.Context, keys: NodeKeys, host: str,
                 port_range: tuple[int, int] | None) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        _configure(self.sock)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a vanished peer fails instead of vanishing
        serve_curve(self.sock, keys.secret, keys.public, "mesh")
        self.endpoint = bind_in_range(self.sock, host, port_range, "the store tunnel")
        self.stores: dict[int, asyncio.Future[int]] = {}  # round -> its store host's loopback port
        self.retired = 0  # rounds up to this one are over here: their opens are refused
        self.streams: dict[tuple[bytes, int, int], Stream] = {}  # (peer identity, round, stream id)

    def host_round(self, round_id: int, port: int) -> None:
        future = self._store(round_id)
        if not future.done():
            future.set_result(port)

    def close_round(self, round_id: int, job_store: bool = False) -> None:
        """Rounds up to `round_id` are over here; the job store (JOB_STORE) only with `job_store`."""
        self.retired = max(self.retired, round_id)
        first = JOB_STORE if job_store else JOB_STORE + 1
        for old in [r for r in self.stores if first <= r <= round_id]:
            self.stores.pop(old).cancel()
        for key in [k for k, s in self.streams.items() if first <= s.round_id <= round_id]:
            self.streams.pop(key).cancel()

    def _store(self, round_id: int) -> asyncio.Future[int]:
        return self.stores.setdefault(round_id, asyncio.get_running_loop().create_future())

    async def serve(self) -> None:
        while True:
            parts = await self.sock.recv_multipart()
            frame = parse(parts[1:])
            if frame is None:
                continue
            op, round_id, stream_id = frame[:3]
            key = (parts[0], round_id, stream_id)
            stream = self.streams.get(key)
            if op == TunnelOp.open and stream is None:
                stream = self.streams[key] = Stream(round_id)
                stream.task = asyncio.create_task(self.connect(key, stream))
            elif op == TunnelOp.data and stream is not None:
                stream.deliver(frame[3])
            elif op == TunnelOp.close and stream is not None:
                self.streams.pop(key).close()

    async def connect(self, key: tuple[bytes, int, int], stream: Stream) -> None:
        """Join the stream to its round's store, once that store is up."""

        async def send(op: TunnelOp, data: bytes) -> None:
            try:
                await self.sock.send_multipart([key[0], *frames(op, key[1], key[2], data)])
            except zmq.ZMQError:  # the peer is gone: so is its end of the stream
                stream.close()

        try:
            port = await self.store_port(key[1])
            reader, writer = await asyncio.open_connection(LOOPBACK, port)
        except (OSError, asyncio.TimeoutError) as exc:  # close_round's cancel is no failure: it propagates
            log.warning("store tunnel: round %d's store is not reachable here (%r); closing a stream", key[1], exc)
            self.streams.pop(key, None)
            stream.close()
            await send(TunnelOp.close, b"")
            return
        stream.attach(writer)
        await pump(reader, stream, send)
        self.streams.pop(key, None)

    async def store_port(self, round_id: int) -> int:
        if JOB_STORE < round_id <= self.retired:
            raise OSError(f"round {round_id} is over on this node")
        return await asyncio.wait_for(asyncio.shield(self._store(round_id)), STORE_WAIT_S)

    def close(self) -> None:
        self.close_round(max([self.retired, *self.stores, *(k[1] for k in self.streams)]), job_store=True)
        self.sock.close()


class RoundRelay:
    """A non-master node's end for one round: local connections to 127.0.0.1:port become streams to the master."""

    def __init__(self, ctx: zmq.asyncio.Context, keys: NodeKeys, round_id: int, master_tunnel: str) -> None:
        self.round_id = round_id
        self.sock = ctx.socket(zmq.DEALER)
        _configure(self.sock)
        connect_curve(self.sock, keys.secret, keys.public, keys.public)  # the job's daemons share the node key
        self.sock.connect(master_tunnel)
        self.streams: dict[int, Stream] = {}
        self.next_id = 0
        self.server: asyncio.Server | None = None
        self.receiver: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Listen on a fresh loopback port (the workers' MASTER_PORT) and return it."""
        self.server = await asyncio.start_server(self.accept, LOOPBACK, 0)
        self.receiver = asyncio.create_task(self.receive())
        return int(self.server.sockets[0].getsockname()[1])

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.next_id += 1
        stream_id, stream = self.next_id, Stream(self.round_id)
        stream.attach(writer)
        stream.task = asyncio.current_task()
        self.streams[stream_id] = stream

        async def send(op: TunnelOp, data: bytes) -> None:
            await self.sock.send_multipart(frames(op, self.round_id, stream_id, data))

        await send(TunnelOp.open, b"")
        await pump(reader, stream, send)
        self.streams.pop(stream_id, None)

    async def receive(self) -> None:
        while True:
            frame = parse(await self.sock.recv_multipart())
            if frame is None or frame[1] != self.round_id:
                continue
            op, _round_id, stream_id, data = frame
            stream = self.streams.get(stream_id)
            if stream is None:
                continue
            if op == TunnelOp.data:
                stream.deliver(data)
            elif op == TunnelOp.close:
                self.streams.pop(stream_id).close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for stream in self.streams.values():
            stream.cancel()
        self.streams.clear()
        if self.receiver is not None:
            self.receiver.cancel()
        self.sock.close()
