"""The I/O loops behind the console: poll a job's replies and follow its daemons' PUBs, with backoff.

Steps arrive pushed (`st.<node>/`, protocol §6.3) and heartbeats too (`hb.<node>/`), from each daemon's own PUB;
job events (`ev.`) only from the coordinator's. The replies (status, workers, metrics for checkpoint ages) are
polled, the big ones slowly. A large job (tui/paging.py) is followed through its summary: `status` brings the
page of nodes around the rows on screen, and only the daemons on screen and the coordinator are followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import zmq

from elasticd.client import ClientError, Event
from elasticd.wire.protocol import ProtocolError
from elasticd.wire.telemetry import StepTelemetry
from tui.session import JobSession, TelemetryHub

log = logging.getLogger("elastic-tui")
POLL_INTERVAL_S = 1.0
WORKERS_EVERY = 2  # polls: worker processes (cpu, rss) every other status
METRICS_EVERY = 5  # polls: checkpoint ages and the rest `st` does not carry; steps themselves are pushed
GOODPUT_NODES = 10  # the nodes with the lowest goodput, in the goodput view
IDLE_TIMEOUT_S = 5.0  # heartbeats come every second: five silent seconds mean resubscribe
ALL_TOPICS = ("",)
TELEMETRY_TOPICS = ("hb.", "st.")
EVENT_TOPICS = ("ev.", "hb.")  # the events source next to a hub: its beats carry the seq that reveals gaps
BAD_DATA = (KeyError, TypeError, ValueError, AttributeError, ArithmeticError)  # 1e400 is infinity
IO_ERRORS = (ClientError, zmq.ZMQError, OSError, *BAD_DATA)
Changed = Callable[[], None]


def reason(err: Exception) -> str:
    """Why a call failed, as the daemon (or the client's timeout) put it."""
    return err.reason if isinstance(err, ClientError) else str(err)


async def poll_job(session: JobSession, changed: Changed, interval_s: float = POLL_INTERVAL_S) -> None:
    """Status every interval, workers and metrics less often; history and ranks on start and new rounds."""
    model, tick, history_loaded, ranks_round = session.model, 0, False, -1
    followers: dict[str, tuple[asyncio.Task[None], bool]] = {}
    hub = session.telemetry() if session.telemetry is not None else None
    hub_task = asyncio.create_task(follow_telemetry(session, hub, changed)) if hub is not None else None
    since: dict[str, float] = {}  # node id -> when the hub began following it
    try:
        while True:
            try:
                await poll_status(session)
                if not history_loaded:
                    model.apply_history((await session.call("events", limit=500))["events"])
                    history_loaded = True
                if model.job.round != ranks_round:
                    model.apply_ranks(await session.call("ranks", history=20))
                    ranks_round = model.job.round
                # every rank and every worker of a large job: its pages carry their nodes' workers instead
                if tick % METRICS_EVERY == 0 and not model.paged:
                    model.apply_metrics(await session.call("metrics"))
                if tick % METRICS_EVERY == 0:
                    await poll_goodput(session)
                if tick % WORKERS_EVERY == 0 and not model.paged:
                    model.apply_workers(await session.call("workers"))
            except IO_ERRORS as err:
                model.connection = f"reconnecting ({reason(err)})"
                model.changed()
            start_followers(session, followers, changed, history_loaded, hub)
            if hub is not None and hub_task is not None and hub_task.done():  # like a follower: restarted
                hub_task = asyncio.create_task(follow_telemetry(session, hub, changed))
            follow_since(session, since)
            if hub is not None:
                mark_silent(session, since)
            changed()
            tick += 1
            session.page_wanted.clear()
            with contextlib.suppress(asyncio.TimeoutError):  # a scroll past the page wakes it early
                await asyncio.wait_for(session.page_wanted.wait(), interval_s)
    finally:
        for task, _ in followers.values():
            task.cancel()
        if hub_task is not None and hub is not None:
            hub_task.cancel()
            hub.close()
        session.close()


async def poll_status(session: JobSession) -> None:
    """The job summary with a page of its nodes (all of a small job); a large job's events PUB from `hello`."""
    model = session.model
    reply = await session.call("status", **session.status_args())
    model.apply_status(reply)
    session.fetched(reply)
    if model.paged and (not session.events_pub or session.events_coordinator != model.job.coordinator):
        session.events_pub = str((await session.call("hello")).get("events_pub") or "")
        session.events_coordinator = model.job.coordinator


def follow_since(session: JobSession, since: dict[str, float]) -> None:
    """Note when each followed daemon began to be followed; one no longer followed (scrolled off) is shown
    from `status` again, not as disconnected."""
    followed = session.followed()
    for node_id in followed:
        since.setdefault(node_id, session.model.clock())
    for node_id in set(since) - set(followed):
        del since[node_id]
        session.model.unfollowed(node_id)


def events_source(session: JobSession, followed: dict[str, tuple[str, str]]) -> str:
    """The pub to take job events from: a large job's events PUB; the coordinator's, else a connected
    daemon's, else the first."""
    model = session.model
    if model.paged and session.events_pub:
        return session.events_pub
    coordinator = model.nodes.get(model.job.coordinator)
    if coordinator is not None and coordinator.connected and coordinator.node_id in followed:
        return followed[coordinator.node_id][1]
    for node_id, (_, pub) in followed.items():
        node = model.nodes.get(node_id)
        if node is not None and node.connected:
            return pub
    return next(iter(followed.values()))[1] if followed else ""


async def poll_goodput(session: JobSession) -> None:
    """The `goodput` reply with the nodes that lose most (a page, however large the job)."""
    try:
        reply = await session.call("goodput", nodes=GOODPUT_NODES)
    except ClientError as err:
        if err.code != "unknown_op":
            raise
        reply = {"unavailable": f"this job's coordinator does not account goodput ({err.reason}): upgrade it"}
    session.model.apply_goodput(reply)


def start_followers(session: JobSession, followers: dict[str, tuple[asyncio.Task[None], bool]], changed: Changed,
                    history_loaded: bool = True, hub: TelemetryHub | None = None) -> None:
    """One stream per daemon (all topics from the events source, `hb.` `st.` from the others); with a hub,
    the hub takes every daemon's heartbeats and steps and only the events source gets a stream of its own."""
    followed = session.followed()
    source = events_source(session, followed)
    if hub is not None:
        hub.follow({pub for _, pub in followed.values()})
    for node_id, (control, pub) in followed.items():
        everything = pub == source
        if hub is not None and not everything:
            task = followers.pop(pub, (None, False))[0]
            if task is not None:
                task.cancel()
            continue
        task, had_events = followers.get(pub, (None, False))
        if task is not None and not task.done() and had_events == everything:
            continue
        if task is not None:
            task.cancel()
        since = session.model.last_event_seq if history_loaded else None
        topics = (EVENT_TOPICS if hub is not None else ALL_TOPICS) if everything else TELEMETRY_TOPICS
        followers[pub] = (asyncio.create_task(follow_daemon(session, node_id, control, pub, changed, topics,
                                                            since)), everything)
    for pub in set(followers) - {pub for _, pub in followed.values()}:
        followers.pop(pub)[0].cancel()


async def follow_telemetry(session: JobSession, hub: TelemetryHub, changed: Changed) -> None:
    """Heartbeats and steps of every daemon from the hub: each batch folded in whole, then one `changed`."""
    while True:
        try:
            batch = await hub.drain(1.0)
        except IO_ERRORS as err:
            log.debug("telemetry: %r", err)
            await asyncio.sleep(0.5)
            continue
        for event in batch:
            ingest(session, event)
        if batch:
            changed()


def mark_silent(session: JobSession, since: dict[str, float]) -> None:
    """With a hub there is no per-daemon stream to time out: a followed daemon this console has not heard from
    for IDLE_TIMEOUT_S (since it began following it) is marked disconnected until its next heartbeat."""
    model = session.model
    now = model.clock()
    for node_id, began in since.items():
        node = model.nodes.get(node_id)
        if node is None:
            continue
        heard = node.heard_at if node.heard_at is not None else began
        if node.connected and heard is not None and now - heard > IDLE_TIMEOUT_S:
            model.disconnected(node.node_id)


async def follow_daemon(session: JobSession, node_id: str, control: str, pub: str, changed: Changed,
                        topics: tuple[str, ...] = ALL_TOPICS, since_seq: int | None = None) -> None:
    """Telemetry of one daemon (all of it, or some topics); a silent or broken one is resubscribed with backoff."""
    backoff = 0.5
    events = any("ev.".startswith(t) or t.startswith("ev.") for t in topics)
    while True:
        link = session.connect(control)
        # Without `ev.` there is no gap to fetch, so no snapshot seq is needed (no status call per daemon).
        since = (session.model.last_event_seq or since_seq) if events else 0
        stream = link.events(pub, since_seq=since, topics=topics, idle_timeout_s=IDLE_TIMEOUT_S)
        try:
            async for event in stream:
                if event.type == "idle":  # IDLE_TIMEOUT_S without a message, heartbeats included
                    raise asyncio.TimeoutError
                backoff = 0.5
                ingest(session, event)
                changed()
        except (asyncio.TimeoutError, *IO_ERRORS) as err:
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
        if event.type == "st":
            if event.kind == "steps":
                model.apply_steps(event.node, StepTelemetry.decode(event.body, "steps"))
        elif event.type == "hb":
            model.apply_heartbeat(event.node, event.body)
        elif event.type == "ev":
            model.apply_event(as_event(event))
    except (*BAD_DATA, ProtocolError) as err:
        log.debug("skipping a malformed %s message from %s: %r", event.type, event.node, err)


def as_event(event: Event) -> dict[str, Any]:
    body = dict(event.body) if isinstance(event.body, dict) else {}
    body.setdefault("seq", event.seq)
    body.setdefault("ts", event.ts)
    body.setdefault("kind", event.kind)
    body.setdefault("node", event.node)
    return body
