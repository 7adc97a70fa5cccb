"""The I/O loops behind the console: poll a job's replies and follow every daemon's PUB, with backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import zmq

from elasticd.client import ClientError, Event
from tui.session import JobSession

log = logging.getLogger("elastic-tui")
POLL_INTERVAL_S = 1.0
IDLE_TIMEOUT_S = 5.0  # heartbeats come every second: five silent seconds mean resubscribe
BAD_DATA = (KeyError, TypeError, ValueError, AttributeError)
IO_ERRORS = (ClientError, zmq.ZMQError, OSError, *BAD_DATA)
Changed = Callable[[], None]


async def poll_job(session: JobSession, changed: Changed, interval_s: float = POLL_INTERVAL_S) -> None:
    """Status and metrics every interval, workers every other; history and ranks on start and new rounds."""
    model, tick, history_loaded, ranks_round = session.model, 0, False, -1
    followers: dict[str, asyncio.Task[None]] = {}
    try:
        while True:
            try:
                model.apply_status(await session.call("status"))
                if not history_loaded:
                    model.apply_history((await session.call("events", limit=500))["events"])
                    history_loaded = True
                if model.job.round != ranks_round:
                    model.apply_ranks(await session.call("ranks", history=20))
                    ranks_round = model.job.round
                model.apply_metrics(await session.call("metrics"))
                if tick % 2 == 0:
                    model.apply_workers(await session.call("workers"))
            except IO_ERRORS as err:
                model.connection = f"reconnecting ({getattr(err, 'reason', err)})"
                model.changed()
            start_followers(session, followers, changed)
            changed()
            tick += 1
            await asyncio.sleep(interval_s)
    finally:
        for task in followers.values():
            task.cancel()
        session.close()


def start_followers(session: JobSession, followers: dict[str, asyncio.Task[None]], changed: Changed) -> None:
    for node_id, (control, pub) in session.followed().items():
        task = followers.get(pub)
        if task is None or task.done():
            followers[pub] = asyncio.create_task(follow_daemon(session, node_id, control, pub, changed))


async def follow_daemon(session: JobSession, node_id: str, control: str, pub: str, changed: Changed) -> None:
    """Heartbeats and events of one daemon; a silent or broken daemon is resubscribed with backoff."""
    backoff = 0.5
    while True:
        link = session.connect(control)
        stream = link.events(pub)
        try:
            while True:
                event = await asyncio.wait_for(stream.__anext__(), IDLE_TIMEOUT_S)
                backoff = 0.5
                ingest(session, event)
                changed()
        except (asyncio.TimeoutError, StopAsyncIteration, *IO_ERRORS) as err:
            log.debug("daemon %s (%s): %r; resubscribing", node_id, pub, err)
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()
            link.close()
        session.model.disconnected(node_id)
        changed()
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 5.0)


def ingest(session: JobSession, event: Event) -> None:
    """Fold one telemetry message into the model; malformed bodies are skipped, never raised."""
    model = session.model
    try:
        if event.type == "hb":
            model.apply_heartbeat(event.node, event.body)
        elif event.type == "ev":
            model.apply_event(as_event(event))
        elif event.type == "st" and event.kind == "step":
            model.apply_step(event.node, event.body)
    except BAD_DATA as err:
        log.debug("skipping a malformed %s message from %s: %r", event.type, event.node, err)


def as_event(event: Event) -> dict[str, Any]:
    body = dict(event.body) if isinstance(event.body, dict) else {}
    body.setdefault("seq", event.seq)
    body.setdefault("ts", event.ts)
    body.setdefault("kind", event.kind)
    body.setdefault("node", event.node)
    return body
