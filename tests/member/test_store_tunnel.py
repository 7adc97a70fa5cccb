"""The round's c10d store with --keys: loopback only, reached from other nodes through the daemons' CURVE tunnel."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import NamedTuple

import pytest
import pytest_asyncio
import zmq
import zmq.asyncio
from support.harness import PLAIN, Job

from elasticd.client import Credentials
from elasticd.job.config import StartError
from elasticd.job.runtime import bind_in_range
from elasticd.keys.auth import Gatekeeper, KeyStore, NodeKeys
from elasticd.member.store.store_tunnel import LOOPBACK, RoundRelay, TunnelServer

QUIET_S = 1.0  # how long "nothing arrives" is watched for


class Store:
    """A stand-in for the store host: an echo server on loopback that records what it saw."""

    def __init__(self) -> None:
        self.connections = 0
        self.closed = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.echo, LOOPBACK, 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def echo(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while data := await reader.read(1024):
            if data == b"bye":
                break
            writer.write(data.upper())
        writer.close()
        self.closed.set()


class Tunnel(NamedTuple):
    ctx: zmq.asyncio.Context
    keys: NodeKeys
    server: TunnelServer
    echo: Store


@pytest_asyncio.fixture
async def tunnel(tmp_path: Path) -> AsyncIterator[Tunnel]:
    store = KeyStore(tmp_path / "keys")
    store.init()
    ctx = zmq.asyncio.Context()
    gate = Gatekeeper(ctx, store)
    gate.start()
    keys = store.node_keys()
    server = TunnelServer(ctx, keys, LOOPBACK, None)
    serving = asyncio.create_task(server.serve())
    echo = Store()
    try:
        yield Tunnel(ctx, keys, server, echo)
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        server.close()
        gate.stop()
        ctx.destroy(linger=0)


async def relay_port(ctx: zmq.asyncio.Context, keys: NodeKeys, round_id: int, endpoint: str) -> tuple[RoundRelay, int]:
    relay = RoundRelay(ctx, keys, round_id, endpoint)
    return relay, await relay.start()


@pytest.mark.asyncio
async def test_streams_wait_for_their_rounds_store_then_relay_both_ways(tunnel: Tunnel) -> None:
    ctx, keys, server, echo = tunnel
    relay, port = await relay_port(ctx, keys, 1, server.endpoint)
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    writer.write(b"early")  # before the master's store is up: the stream waits for it
    await writer.drain()
    await asyncio.sleep(0.2)
    server.host_round(1, await echo.start())
    assert await asyncio.wait_for(reader.readexactly(5), 10) == b"EARLY"
    writer.write(b"again")
    assert await asyncio.wait_for(reader.readexactly(5), 10) == b"AGAIN"
    writer.write(b"bye")  # the store hangs up: so does the worker's end
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    relay.close()


@pytest.mark.asyncio
async def test_a_worker_hanging_up_closes_the_stores_end(tunnel: Tunnel) -> None:
    ctx, keys, server, echo = tunnel
    server.host_round(3, await echo.start())
    relay, port = await relay_port(ctx, keys, 3, server.endpoint)
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    writer.write(b"x")
    assert await asyncio.wait_for(reader.readexactly(1), 10) == b"X"
    writer.close()
    await asyncio.wait_for(echo.closed.wait(), 10)
    relay.close()


@pytest.mark.asyncio
async def test_a_round_that_is_over_refuses_new_streams(tunnel: Tunnel) -> None:
    ctx, keys, server, echo = tunnel
    server.host_round(2, await echo.start())
    server.close_round(2)
    relay, port = await relay_port(ctx, keys, 2, server.endpoint)
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    writer.write(b"late")
    assert await asyncio.wait_for(reader.read(), 10) == b""
    assert echo.connections == 0
    relay.close()


@pytest.mark.asyncio
async def test_a_peer_without_the_node_key_reaches_nothing(tunnel: Tunnel, tmp_path: Path) -> None:
    ctx, _, server, echo = tunnel
    other = KeyStore(tmp_path / "other")
    other.init()
    server.host_round(1, await echo.start())
    relay, port = await relay_port(ctx, other.node_keys(), 1, server.endpoint)
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    writer.write(b"let me in")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(reader.read(1), QUIET_S)
    assert echo.connections == 0
    writer.close()
    relay.close()


def test_a_port_range_with_no_free_port_is_a_clear_start_error() -> None:
    ctx = zmq.Context.instance()
    with ctx.socket(zmq.ROUTER) as busy, ctx.socket(zmq.ROUTER) as sock:
        port = int(bind_in_range(busy, LOOPBACK, None, "a test socket").rpartition(":")[2])
        with pytest.raises(StartError, match=f"no free port for the store tunnel in --port-range {port}-{port}"):
            bind_in_range(sock, LOOPBACK, (port, port), "the store tunnel")


def test_keyed_ddp_reaches_rank_0s_loopback_store_through_the_tunnel(tmp_path: Path) -> None:
    """Rank 0 is on node b (--node-rank 0), which execs its store host (no zygote); node a, the coordinator,
    relays its rank's store connections to b through the tunnel, bound on ports from --port-range."""
    store = KeyStore(tmp_path / "keys")
    store.init()
    with Job(tmp_path, nnodes="2", nproc=1, extra=["--keys", str(tmp_path / "keys")]) as job:
        job.credentials = Credentials.load(str(store.create_client("ops", "operator")),
                                           str(store.node_dir / "node.key"))
        low = 20000 + job.port % 20000
        script = ("--steps", "100000", "--snapshot", str(tmp_path / "snap.pt"))
        ports = ["--port-range", f"{low}-{low + 50}"]
        a = job.start("a", PLAIN, *script, extra=["--node-rank", "1", *ports])
        b = job.start("b", PLAIN, *script, extra=["--node-rank", "0", "--no-zygote", *ports])
        b.wait_line(r"step=\d+ world_size=2 ", timeout=120)
        a.wait_line(r"world_size=2 rank=1 ")
        tunnels = [n["store_tunnel"] for n in job.status()["nodes"]]
        assert len(tunnels) == 2 and all(low <= int(t.rpartition(":")[2]) <= low + 50 for t in tunnels), tunnels
