"""A daemon link closed under a waiting call: the client says so at once, and a node query goes on through the next."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest
import zmq
import zmq.asyncio

from elasticd.client import AsyncClient, ClientError, Event
from tui.session import JobSession

pytestmark = pytest.mark.quick


class Link:
    """A daemon link whose calls wait until it is closed (a daemon slow under load), or answer at once."""

    def __init__(self, answers: bool) -> None:
        self.answers, self.closed = answers, asyncio.Event()
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def call(self, op: str, timeout_s: float | None = None, **args: Any) -> dict[str, Any]:
        self.asked.append((op, args))
        if self.answers:
            return {"ok": True, "lines": ["tick=1"]}
        await self.closed.wait()
        raise ClientError("closed", "the connection was closed while the call waited")

    async def events(self, pub: str, since_seq: int | None = None, topics: tuple[str, ...] = ("",),
                     idle_timeout_s: float | None = None) -> AsyncGenerator[Event, None]:
        yield Event("idle", "idle", "", 0, 0.0)

    def close(self) -> None:
        self.closed.set()


@pytest.mark.asyncio
async def test_a_node_query_whose_link_the_status_poll_dropped_is_asked_again_through_a_fresh_one() -> None:
    """The status poll drops a link whose daemon did not answer in time (a fresh socket next time); a `logs` read
    waiting on that link is not the node's silence: it is asked again, once, and the follow goes on."""
    made: list[Link] = []

    def connect(control: str) -> Link:
        made.append(Link(answers=len(made) > 0))
        return made[-1]

    session = JobSession("job", ["tcp://a"], connect=connect)
    query = asyncio.create_task(session.ask_node("logs", node="a", rank=0))
    while not made or not made[0].asked:
        await asyncio.sleep(0)
    session.drop("tcp://a")  # what `call` does to a link that timed out
    assert await asyncio.wait_for(query, 5) == {"ok": True, "lines": ["tick=1"]}
    assert [link.asked for link in made] == [[("logs", {"node": "a", "rank": 0})]] * 2


@pytest.mark.asyncio
async def test_a_node_query_on_a_link_closed_but_not_dropped_fails_with_the_reason() -> None:
    """Closed by anything but the session's own failover (the console shutting down), the error stands."""
    link = Link(answers=False)
    session = JobSession("job", ["tcp://a"], connect=lambda control: link)
    query = asyncio.create_task(session.ask_node("logs", node="a", rank=0))
    while not link.asked:
        await asyncio.sleep(0)
    link.close()
    with pytest.raises(ClientError) as info:
        await asyncio.wait_for(query, 5)
    assert info.value.code == "closed" and len(link.asked) == 1


@pytest.mark.asyncio
async def test_an_async_call_waiting_when_its_client_closes_fails_at_once_saying_so() -> None:
    """Not with the socket's own error (`Socket operation on non-socket`), nor at its 30 s deadline."""
    daemon = zmq.asyncio.Context.instance().socket(zmq.ROUTER)  # takes the request, never answers
    port = daemon.bind_to_random_port("tcp://127.0.0.1")
    client = AsyncClient(f"tcp://127.0.0.1:{port}", timeout_s=30)
    try:
        call = asyncio.create_task(client.call("logs", node="a"))
        await asyncio.wait_for(daemon.recv_multipart(), 10)  # the request is out: the call waits for its reply
        client.close()
        with pytest.raises(ClientError) as info:
            await asyncio.wait_for(call, 10)
        assert info.value.code == "closed" and "closed while the call waited" in info.value.reason
    finally:
        client.close()
        daemon.close(linger=0)
