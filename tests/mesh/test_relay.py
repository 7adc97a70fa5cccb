"""Relays on real sockets: a member's frames reach the coordinator through its relay and back, in batches; a
member's death behind a relay is seen; a relay's death sends its group straight to the coordinator."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import zmq
import zmq.asyncio
from support.harness import free_port

from elasticd.mesh import member_mesh
from elasticd.mesh.coordinator_mesh import CoordinatorMesh
from elasticd.mesh.member_mesh import MemberMesh
from elasticd.mesh.relay import Relay
from elasticd.wire.names import RELAY_MANY, MeshOp
from elasticd.wire.protocol import Envelope

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`


class Node:
    """A member daemon's mesh side: its link, what it heard, and (if it relays) its relay."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, node_id: str, relays: bool = False) -> None:
        self.node_id = node_id
        self.mesh = MemberMesh(ctx, endpoint, node_id, f"{node_id}-1", None)
        self.heard: list[Envelope] = []
        self.batches: list[bytes] = []  # the kind of each batch the coordinator sent its relay
        self.relay = Relay(ctx, "127.0.0.1", None, None, self.mesh.send_parts) if relays else None
        self.mesh.on_batch = self.deliver
        self.tasks = [asyncio.create_task(self.mesh.serve(lambda _s, env: self.heard.append(env)))]
        if self.relay is not None:
            self.tasks.append(asyncio.create_task(self.relay.serve()))

    def deliver(self, parts: list[bytes]) -> None:
        self.batches.append(parts[0])
        assert self.relay is not None
        self.relay.deliver(parts)

    def say(self, op: MeshOp, **body: Any) -> None:
        self.mesh.send(op, body)

    def close(self) -> None:
        """Its daemon dies (again: nothing)."""
        if self.mesh.done.is_set():
            return
        for task in self.tasks:
            task.cancel()
        self.mesh.close()
        if self.relay is not None:
            self.relay.close()


class Coordinator:
    """The coordinator's mesh, welcoming every `register`; `via` is its relay assignment."""

    def __init__(self, ctx: zmq.asyncio.Context) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.mesh = CoordinatorMesh(ctx, self.endpoint, "coord", None)
        self.via: dict[str, str] = {}
        self.mesh.route_by(lambda node_id: self.via.get(node_id, ""))
        self.heard: list[tuple[str, str]] = []  # (sender, op)
        self.closed: list[str] = []
        self.sent: list[list[bytes]] = []  # every message its ROUTER sent
        send_parts = self.mesh.send_parts

        def counted(parts: list[bytes], what: str) -> zmq.ZMQError | None:
            self.sent.append(parts)
            return send_parts(parts, what)

        self.mesh.send_parts = counted  # type: ignore[method-assign]
        self.task = asyncio.create_task(self.mesh.serve(self.on_frame, self.closed.append))

    def on_frame(self, sender: str, env: Envelope) -> None:
        self.heard.append((sender, env.op))
        if env.op == MeshOp.register:
            self.mesh.send(sender, MeshOp.welcome, {"ok": True})

    def close(self) -> None:
        self.task.cancel()
        self.mesh.close()


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def group(members: int = 2) -> AsyncIterator[tuple[Coordinator, Node, list[Node]]]:
    """A coordinator, relay `r`, and `members` nodes registered and sending through `r`; all closed after."""
    ctx = zmq.asyncio.Context()
    coord = Coordinator(ctx)
    relay = Node(ctx, coord.endpoint, "r", relays=True)
    nodes = [Node(ctx, coord.endpoint, f"m{i}") for i in range(members)]
    try:
        for node in (relay, *nodes):
            node.say(MeshOp.register)
        await until(lambda: sum(op == MeshOp.register for _s, op in coord.heard) == members + 1)
        assert relay.relay is not None
        for node in nodes:
            coord.via[node.node_id] = "r"
            node.mesh.route(relay.relay.endpoint)
        await until(lambda: all(n.mesh.via for n in nodes))
        yield coord, relay, nodes
    finally:
        for node in (*nodes, relay):
            node.close()
        coord.close()
        ctx.term()


def test_frames_cross_a_relay_both_ways_and_a_broadcast_crosses_it_once() -> None:
    async def case() -> None:
        async with group(members=3) as (coord, relay, nodes):
            coord.heard.clear()
            for node in nodes:
                node.say(MeshOp.hb, beat=1)
            await until(lambda: len(coord.heard) == 3)
            assert sorted(coord.heard) == [("m0", MeshOp.hb), ("m1", MeshOp.hb), ("m2", MeshOp.hb)]  # each its own

            coord.sent.clear()
            coord.mesh.send_all(["m0", "m1", "m2"], MeshOp.go, {"round": 7})
            coord.mesh.send("m1", MeshOp.round, {"round": 7})
            await until(lambda: all(any(e.op == MeshOp.go for e in n.heard) for n in nodes))
            await until(lambda: any(e.op == MeshOp.round for e in nodes[1].heard))
            # One loop turn's frames for the group: one message to the relay for the shared `go`, one for `round`.
            assert [parts[1] for parts in coord.sent] == [RELAY_MANY, b"relay-down"]
            assert [e.body for e in nodes[0].heard if e.op == MeshOp.go] == [{"round": 7}]
            assert [e.op for e in relay.heard] == [MeshOp.welcome]  # its own; it reads nothing it forwards

    asyncio.run(case())


def test_a_member_that_dies_behind_its_relay_is_reported_closed_and_unreachable() -> None:
    async def case() -> None:
        async with group() as (coord, _relay, nodes):
            nodes[0].say(MeshOp.hb, beat=1)
            await until(lambda: coord.mesh.connected("m0"))
            nodes[0].close()
            await until(lambda: "m0" in coord.closed)
            assert not coord.mesh.connected("m0")
            assert coord.mesh.connected("m1") and "m1" not in coord.closed and "r" not in coord.closed

    asyncio.run(case())


def test_a_dead_relays_group_talks_to_the_coordinator_directly() -> None:
    async def case() -> None:
        async with group() as (coord, relay, nodes):
            relay.close()
            await until(lambda: all(not n.mesh.via for n in nodes))  # each saw its link drop and went direct
            await until(lambda: "r" in coord.closed)
            assert "m0" not in coord.closed and "m1" not in coord.closed  # the relay's loss is not its members'
            coord.heard.clear()
            nodes[0].say(MeshOp.hb, beat=2)
            await until(lambda: ("m0", MeshOp.hb) in coord.heard)
            coord.mesh.send("m0", MeshOp.round, {"round": 8})
            await until(lambda: any(e.op == MeshOp.round for e in nodes[0].heard))

    asyncio.run(case())


def test_a_relay_speaks_only_for_the_members_assigned_to_it() -> None:
    async def case() -> None:
        async with group() as (coord, _relay, nodes):
            coord.via["m1"] = ""  # reassigned: m1's frames through r are no longer taken
            coord.heard.clear()
            nodes[0].say(MeshOp.hb, beat=1)
            nodes[1].say(MeshOp.hb, beat=1)
            await until(lambda: ("m0", MeshOp.hb) in coord.heard)
            await asyncio.sleep(0.3)  # past the relay's heartbeat hold: m1's beat went up with m0's
            assert ("m1", MeshOp.hb) not in coord.heard

    asyncio.run(case())


def test_a_relay_that_cannot_be_reached_leaves_the_member_direct_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(member_mesh, "RELAY_CONNECT_S", 0.5)

    async def case() -> None:
        async with group(members=1) as (coord, _relay, nodes):
            node = nodes[0]
            node.mesh.route("")
            await until(lambda: not node.mesh.via)
            nowhere = f"tcp://127.0.0.1:{free_port()}"
            node.mesh.route(nowhere)
            await until(lambda: node.mesh.via_failed == nowhere, timeout=3.0)
            assert node.mesh.state() == {"via": "", "via_failed": nowhere}
            coord.heard.clear()
            node.say(MeshOp.hb, beat=1)  # still heard, directly
            await until(lambda: ("m0", MeshOp.hb) in coord.heard)

    asyncio.run(case())
