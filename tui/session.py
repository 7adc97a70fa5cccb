"""One job's connections: calls with failover across its daemons, with timeouts; no Textual here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any, Protocol

import zmq
import zmq.asyncio

from elasticd.client import AsyncClient, ClientError, Credentials, Event, parse_telemetry
from elasticd.wire.handshake import CODES as HANDSHAKE_CODES
from tui.model import Clock, JobModel
from tui.paging import FIRST_PAGE, RowsShown

CALL_TIMEOUT_S = 2.0
STEER_TIMEOUT_S = 6.0
NODE_QUERY_TIMEOUT_S = 6.0  # past a forwarding member's own 5 s: the reason (node lost, silent) comes back


class DaemonLink(Protocol):
    """What the console needs of one daemon; `elasticd.client.AsyncClient` is the live one."""

    async def call(self, op: str, timeout_s: float | None = None, **args: Any) -> dict[str, Any]: ...
    def events(self, pub: str, since_seq: int | None = None, topics: tuple[str, ...] = ("",),
               idle_timeout_s: float | None = None) -> AsyncGenerator[Event, None]: ...
    def close(self) -> None: ...


Connector = Callable[[str], DaemonLink]


class LiveConnector:
    """Connects to real daemons, with CURVE credentials when the job was started with --keys."""

    def __init__(self, credentials: Credentials | None = None) -> None:
        self.credentials = credentials

    def __call__(self, control: str) -> DaemonLink:
        return AsyncClient(control, timeout_s=CALL_TIMEOUT_S, credentials=self.credentials)

    def telemetry(self) -> ZmqTelemetry:
        return ZmqTelemetry(credentials=self.credentials)


live_link = LiveConnector()


class TelemetryHub(Protocol):
    """Heartbeats and steps of many daemons through one subscription, read in batches."""

    def follow(self, pubs: set[str]) -> None: ...
    async def drain(self, timeout_s: float) -> list[Event]: ...
    def close(self) -> None: ...


class ZmqTelemetry:
    """One SUB socket connected to every daemon's PUB (`hb.` and `st.` only): one wakeup per batch of messages.

    ZeroMQ reconnects by itself to a PUB that went away and came back; silence shows as heartbeat age.
    """

    def __init__(self, topics: tuple[str, ...] = ("hb.", "st."), batch: int = 4096,
                 credentials: Credentials | None = None) -> None:
        self.topics, self.credentials = topics, credentials
        self.pubs: set[str] = set()
        self.batch = batch
        self.retired: list[zmq.asyncio.Socket] = []  # replaced sockets, closed once no drain reads them
        self.open()

    def open(self) -> None:
        self.sock = zmq.asyncio.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        if self.credentials is not None:
            self.credentials.apply(self.sock)
        for topic in self.topics:
            self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        # non-blocking reads without a future each
        self.sync: zmq.Socket[bytes] = zmq.Socket.shadow(self.sock.underlying)

    def follow(self, pubs: set[str]) -> None:
        """Connect to these PUBs only. A SUB never disconnects one: libzmq aborts the process when a message
        of two frames is queued from the PUB being disconnected (libzmq#2163, `!_more` in fq.cpp), which
        paging a large job hit. Dropping any PUB takes a fresh socket instead."""
        added = pubs - self.pubs
        if self.pubs - pubs:
            self.retired.append(self.sock)
            self.open()
            added = set(pubs)
        for pub in added:
            self.sock.connect(pub)
        self.pubs = set(pubs)

    async def drain(self, timeout_s: float) -> list[Event]:
        """Every message ready now (waiting up to `timeout_s` for the first); malformed frames are dropped."""
        for old in self.retired:  # drains run one at a time: none reads these any more
            old.close()
        self.retired.clear()
        sock, sync = self.sock, self.sync  # a `follow` meanwhile swaps the socket: this drain ends on its own
        if not await sock.poll(int(timeout_s * 1000)):
            return []
        found: list[Event] = []
        while len(found) < self.batch:
            try:
                frames = sync.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            event = parse_telemetry(frames)
            if event is not None:
                found.append(event)
        return found

    def close(self) -> None:
        for sock in (*self.retired, self.sock):
            sock.close()


class JobSession:
    """A job seen through any of its daemons: the first that answers serves the whole job."""

    def __init__(self, job_id: str, seeds: list[str], connect: Connector = live_link,
                 clock: Clock = time.time, seed_pubs: dict[str, str] | None = None,
                 telemetry: Callable[[], TelemetryHub] | None = None) -> None:
        self.job_id = job_id
        # Live daemons: one shared subscription for heartbeats and steps; other links: one stream per daemon.
        self.telemetry = telemetry if telemetry is not None else getattr(connect, "telemetry", None)
        self.seeds = list(seeds)
        self.seed_pubs = dict(seed_pubs or {})
        self.connect = connect
        self.model = JobModel(job_id, clock)
        self.links: dict[str, DaemonLink] = {}
        self.active = seeds[0] if seeds else ""
        # A paged (large) job: the rows on screen, the page last fetched, and where the job's events are published.
        self.rows_shown = RowsShown()
        self.page: tuple[int, int] | None = None
        self.page_wanted = asyncio.Event()  # the rows shown left the page: the poller fetches now, not in a second
        self.events_pub, self.events_coordinator = "", ""

    def link(self, control: str) -> DaemonLink:
        if control not in self.links:
            self.links[control] = self.connect(control)
        return self.links[control]

    def drop(self, control: str) -> None:
        link = self.links.pop(control, None)
        if link is not None:
            link.close()

    def candidates(self) -> Iterator[str]:
        """The active daemon, the seeds, then every known daemon: read only as far as a call fails over."""
        tried: set[str] = set()
        for control in (self.active, *self.seeds):
            if control and control not in tried:
                tried.add(control)
                yield control
        # taken at once: telemetry may add nodes while a call waits
        known = [n.control for n in self.model.nodes.values() if n.control and n.status == "alive"]
        for control in known:
            if control not in tried:
                tried.add(control)
                yield control

    async def call(self, op: str, timeout_s: float = CALL_TIMEOUT_S, **args: Any) -> dict[str, Any]:
        """Ask the active daemon, then the others; a verb's own error (refused, not found) is final."""
        last: ClientError | None = None
        for control in self.candidates():
            try:
                reply = await self.link(control).call(op, timeout_s=timeout_s, **args)
            except ClientError as err:
                if err.code in HANDSHAKE_CODES:
                    self.drop(control)  # ZeroMQ never retries a refused key: a fresh socket once it is authorized
                if err.code not in ("timeout", "not_running"):
                    raise
                last = err
                self.drop(control)  # a fresh socket next time: a stuck peer never wedges this one
                continue
            self.active = control
            return reply
        raise last or ClientError("timeout", f"no daemon of job {self.job_id} answered")

    async def ask_node(self, op: str, **args: Any) -> dict[str, Any]:
        """A node query (`logs`, `stacks`) through the active daemon, which carries it to the node named. Its
        errors are that node's (lost, silent): final, with no failover and no fresh sockets. The status poll moves
        `active` off a daemon that stops answering, and drops its link: a query that waited on that link is asked
        again, once, through the link in use now (on a loaded machine a follow otherwise ended there)."""
        link = self.link(self.active)
        try:
            return await link.call(op, timeout_s=NODE_QUERY_TIMEOUT_S, **args)
        except ClientError as err:
            if err.code != "closed" or any(other is link for other in self.links.values()):
                raise
        return await self.link(self.active).call(op, timeout_s=NODE_QUERY_TIMEOUT_S, **args)

    # ---- paging a large job ------------------------------------------------------------------------
    def status_args(self) -> dict[str, int]:
        """A page of the node list around the rows shown for a large job; all of a small one."""
        if not self.model.nodes_total:  # the job's size is not known yet: a first page, all of a small job
            return {"nodes_limit": FIRST_PAGE}
        if not self.model.paged:
            return {}
        offset, limit = self.rows_shown.page()
        return {"nodes_offset": offset, "nodes_limit": limit}

    def fetched(self, reply: dict[str, Any]) -> None:
        self.page = (int(reply.get("nodes_offset", 0)), len(reply.get("nodes", [])))

    def show_rows(self, first: int, count: int) -> None:
        """The nodes table scrolled: past the page fetched, the poller is woken to fetch the new one."""
        self.rows_shown = RowsShown(first, count)
        if self.model.paged and (self.page is None or not self.rows_shown.covered_by(*self.page)):
            self.page_wanted.set()

    def shown_nodes(self) -> list[str]:
        first, count = self.rows_shown.first, self.rows_shown.count
        return [node_id for node_id in self.model.joined[first:first + count] if node_id is not None]

    def followed(self) -> dict[str, tuple[str, str]]:
        """node id -> (control, pub) of every daemon to subscribe to: all of a small job; of a large one, the
        daemons on screen and the coordinator (its PUB carries the job's events)."""
        model = self.model
        nodes = [model.nodes[n] for n in self.shown_nodes()] if model.paged else model.nodes.values()
        found = {n.node_id: (n.control, n.pub) for n in nodes if n.control and n.pub and n.status == "alive"}
        if model.paged:
            if self.events_pub and self.events_pub not in {pub for _, pub in found.values()}:
                found[model.job.coordinator or "@events"] = (self.active, self.events_pub)
            return found
        for control, pub in self.seed_pubs.items():
            if pub not in {p for _, p in found.values()}:
                found.setdefault(f"@{control}", (control, pub))
        return found

    def close(self) -> None:
        for control in list(self.links):
            self.drop(control)
