"""Connections a keyed listening socket refused before its authenticator was asked, seen through libzmq monitors."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import socket
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import zmq

from elasticd.keys.tcp_closed import Closed, ClosedFeed

log = logging.getLogger("elasticd")

FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL  # a DISCONNECTED follows at once
SETTLED = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH  # the authenticator records its own refusals
EVENTS = (zmq.EVENT_LISTENING | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_MONITOR_STOPPED
          | FAILED | SETTLED)
POLL_MS = 100  # how soon the watch thread takes up a socket watched since, or a stop()
RESOLVE_POLL_MS = 20  # while a refused peer's address is awaited from the kernel
PATIENCE_S = 1.0  # the kernel frees a closed socket within a round trip; past this the peer stays UNKNOWN
KEEP_S = 2 * PATIENCE_S  # how long freed sockets and closed peers are remembered for matching
MAX_FREED = 65536  # freed sockets remembered at most: a host closing connections by the thousand stays bounded
MAX_BATCH = 1024  # monitor messages read in one go: a flood still lets refusals through to the daemon in turn
UNKNOWN = "?"  # the connection was gone before its address could be read, and the kernel did not tell it either
LOCAL = "local"  # an ipc:// peer: a user of this host
GREETING = ("greeting", "not a ZeroMQ greeting (another protocol, or ZMTP 1.0)")
_PROTOCOL = {getattr(zmq, n): n.removeprefix("PROTOCOL_ERROR_").lower() for n in dir(zmq)
             if n.startswith("PROTOCOL_ERROR_")}
_ids = itertools.count()
_WATCHES: dict[int, PeerWatch] = {}  # context (libzmq address) -> its watch; one per context, as with ZAP

Peer = tuple[str, int]  # IP address and port
S = TypeVar("S", bound=zmq.Socket[object])  # a socket and its monitor's copy are of one kind (asyncio or plain)


class Refused(NamedTuple):
    """One refused connection, as the daemon records it."""

    domain: str
    peer: str
    stage: str
    reason: str


class _Unresolved(NamedTuple):
    """A refused connection whose peer address is not known yet."""

    at: float  # when it was refused
    port: int
    refused: Refused


def failure(event: int, value: int) -> tuple[str, str]:
    """The stage and reason of a handshake failure event (`value`: an errno or a ZMTP protocol error)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        detail = f": {os.strerror(value)}" if value else ""
        return "handshake", f"the client hung up during the handshake (no key, or a port scan){detail}"
    if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "mechanism", "no key: the client's handshake is not CURVE"
    if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "handshake", "CURVE handshake failed: the client's server key is not this job's node key"
    return "handshake", f"protocol error {_PROTOCOL.get(value, hex(value))}"


def peer_of(fd: int, port: int) -> Peer | None:
    """The other end of libzmq's accepted `fd`; None once it is closed or the number is another socket's now."""
    try:
        copy = os.dup(fd)  # ours to close: libzmq's own descriptor stays untouched
    except OSError:
        return None
    try:
        sock = socket.socket(fileno=copy)
    except OSError:  # not a socket (any more); socket() leaves the copy open
        os.close(copy)
        return None
    with sock:
        try:
            if sock.family != socket.AF_INET or sock.getsockname()[1] != port:
                return None
            ip, peer_port = sock.getpeername()
        except OSError:
            return None
    return str(ip), int(peer_port)


@dataclass
class _Listener:
    """One monitored socket, and what its connections showed so far.

    libzmq names the fd only in ACCEPTED and DISCONNECTED: a failed handshake is the DISCONNECTED right after a
    failure event; a success (or a key the authenticator refused) names no connection, so it is counted in `settled`
    against the `pending` ones until they can be told apart.
    """

    pair: zmq.Socket[bytes]
    domain: str
    taps: list[tuple[zmq.Socket[bytes], int]] = field(default_factory=list)  # others' copies: (PAIR, events)
    lock: threading.Lock = field(default_factory=threading.Lock)  # over `taps`, which the daemon's thread adds to
    port: int = 0  # from the first event's endpoint (LISTENING, at bind); 0 for ipc://
    peers: dict[int, Peer | None] = field(default_factory=dict)  # open fd -> its peer (None: gone before we looked)
    looked_up: set[int] = field(default_factory=set)  # fds whose peer the last batch read: see `distrust`
    pending: set[int] = field(default_factory=set)
    settled: int = 0
    failure: tuple[str, str] | None = None

    def accepted(self, fd: int, peer: Peer | None) -> None:
        self.peers[fd] = peer
        self.pending.add(fd)
        if peer is not None:
            self.looked_up.add(fd)

    def distrust(self, batch: list[tuple[int, int]]) -> None:
        """Forget a peer read from an fd that, by the next batch, was closed and given to a new connection: the
        number may have been the new one's when we read it (a DISCONNECTED comes before the close, and an
        ACCEPTED right after the accept)."""
        closed_at: dict[int, int] = {}
        accepted_at: dict[int, int] = {}
        for i, (event, fd) in enumerate(batch):
            if event == zmq.EVENT_DISCONNECTED:
                closed_at.setdefault(fd, i)
            elif event == zmq.EVENT_ACCEPTED:
                accepted_at[fd] = i
        for fd in self.looked_up & closed_at.keys():
            if accepted_at.get(fd, -1) > closed_at[fd] and fd in self.peers:
                self.peers[fd] = None
        self.looked_up = set()

    def settle(self) -> None:
        self.settled += 1
        self._settled_all()

    def closed(self, fd: int) -> tuple[str, str] | None:
        """(stage, reason) when this DISCONNECTED ends a refused connection; None for one that got in."""
        why, self.failure = self.failure, None
        if why is None:
            if fd not in self.pending:
                return None
            if self.settled:  # it may be one that succeeded: forget the pending, never report a good client
                self.pending.clear()
                self.settled = 0
                return None
            why = GREETING
        self.pending.discard(fd)
        self._settled_all()
        return why

    def _settled_all(self) -> None:
        if self.settled >= len(self.pending):
            self.pending.clear()
            self.settled = 0


class PeerWatch:
    """A thread reading the monitors of the keyed listening sockets; it hands refused connections to `deliver`.

    A thread, not the daemon's loop: the peer's address is read from the accepted socket, and libzmq closes a
    client without a key a round trip or two after the accept. One closed sooner is matched to the socket the
    kernel frees on that port (tcp_closed.py).
    """

    def __init__(self, ctx: zmq.Context[zmq.Socket[object]], deliver: Callable[[list[Refused]], object]) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(ctx.underlying)  # plain: the thread blocks
        self.deliver = deliver
        self.incoming: queue.Queue[_Listener] = queue.Queue()
        # The daemon's sockets, touched only from its thread; weakly: one dropped after a failed bind is closed by
        # the garbage collector, as it would be unwatched (else the context's term would wait on it forever).
        self.watched: weakref.WeakKeyDictionary[zmq.Socket[object], _Listener] = weakref.WeakKeyDictionary()
        # The watch thread's own, from here on.
        self.listeners: dict[zmq.Socket[bytes], _Listener] = {}
        self.feed: ClosedFeed | None = None
        # Sockets freed in this network namespace, when we heard of them: any port, since a listener's is learnt
        # from its monitor, which may be read after the kernel told of its first connections.
        self.freed: deque[tuple[float, Closed]] = deque(maxlen=MAX_FREED)
        self.known: dict[Closed, float] = {}  # peers whose sockets we read before they closed -> when they closed
        self.unresolved: list[_Unresolved] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="elasticd-peer-watch", daemon=True)

    def add(self, sock: zmq.Socket[bytes], domain: str) -> None:
        """Watch `sock`, a CURVE server of ZAP `domain`, before it binds; from the thread that owns it."""
        endpoint = _endpoint()
        sock.monitor(endpoint, EVENTS)
        pair = self.ctx.socket(zmq.PAIR)
        pair.rcvhwm = 0  # unbounded: libzmq would stall its I/O thread on a full monitor pipe, the daemon with it
        pair.connect(endpoint)
        listener = _Listener(pair, domain)
        self.watched[sock] = listener
        self.incoming.put(listener)

    def tap(self, sock: S, events: int) -> S | None:
        """A PAIR (of `sock`'s context) that gets `sock`'s monitor messages of `events`; None if it is not watched.
        Right after `add`, from the same thread."""
        listener = self.watched.get(sock)
        if listener is None:
            return None
        endpoint = _endpoint()
        copies = self.ctx.socket(zmq.PAIR)
        copies.sndhwm = 0  # never drop a DISCONNECTED its reader relies on
        copies.bind(endpoint)
        tap: S = sock.context.socket(zmq.PAIR)
        tap.rcvhwm = 0
        tap.connect(endpoint)
        with listener.lock:
            listener.taps.append((copies, events))
        return tap

    def start(self) -> None:
        _WATCHES[self.ctx.underlying] = self
        self.thread.start()

    def stop(self) -> None:
        """After the watched sockets are closed, before their context is."""
        _WATCHES.pop(self.ctx.underlying, None)
        for sock in list(self.watched):
            if not sock.closed:  # libzmq would block on a monitor pipe whose reader is gone
                sock.disable_monitor()
        self.stopping.set()
        self.thread.join()

    def run(self) -> None:
        poller = zmq.Poller()
        self.feed = ClosedFeed()
        if self.feed.sock is not None:
            poller.register(self.feed.sock, zmq.POLLIN)
        try:
            while not self.stopping.is_set():
                self.turn(poller)
        finally:
            while not self.incoming.empty():  # watched too late to be taken up
                self.drop(self.incoming.get())
            for listener in list(self.listeners.values()):
                self.drop(listener)
            self.feed.close()

    def turn(self, poller: zmq.Poller) -> None:
        """One poll: take up new sockets, read what the kernel and the monitors said, hand on what is refused."""
        try:
            while not self.incoming.empty():
                listener = self.incoming.get()
                self.listeners[listener.pair] = listener
                poller.register(listener.pair, zmq.POLLIN)
            poller.poll(RESOLVE_POLL_MS if self.unresolved else POLL_MS)
            now = time.monotonic()
            self.hear(now)  # first: a freed socket's DISCONNECTED is then read too, whatever it was
            refused = [r for listener in list(self.listeners.values()) for r in self.read(poller, listener, now)]
            refused += self.resolve(now)
            if refused:
                self.deliver(refused)
        except zmq.ContextTerminated:
            self.stopping.set()
        except Exception:  # a bug here must not stop the reading: a monitor nobody reads grows without end
            log.exception("watching refused connections failed")
            self.stopping.wait(POLL_MS / 1000)  # and must not spin either

    def hear(self, now: float) -> None:
        """Take in the sockets the kernel freed since the last turn; forget what is too old to match."""
        assert self.feed is not None
        self.freed.extend((now, closed) for closed in self.feed.read())
        while self.freed and now - self.freed[0][0] > KEEP_S:
            self.freed.popleft()
        self.known = {peer: at for peer, at in self.known.items() if now - at <= KEEP_S}

    def read(self, poller: zmq.Poller, listener: _Listener, now: float) -> list[Refused]:
        """What one listener's monitor said since the last turn (each message copied to its taps), judged."""
        batch: list[tuple[int, int]] = []
        with listener.lock:
            taps = list(listener.taps)
        while len(batch) < MAX_BATCH:
            try:
                frames = listener.pair.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            event, value = struct.unpack("=HI", frames[0])
            batch.append((event, value))
            if not listener.port and frames[1].startswith(b"tcp://"):
                listener.port = int(frames[1].rpartition(b":")[2])
            for copies, events in taps:
                if event & events:
                    with contextlib.suppress(zmq.Again):  # its reader closed it: the socket is closing too
                        copies.send_multipart(frames, zmq.NOBLOCK)
        if any(event == zmq.EVENT_MONITOR_STOPPED for event, _ in batch):
            poller.unregister(listener.pair)
            self.drop(listener)
        listener.distrust(batch)
        return self.judge(listener, batch, now)

    def drop(self, listener: _Listener) -> None:
        self.listeners.pop(listener.pair, None)
        listener.pair.close(linger=0)
        with listener.lock:
            for copies, _ in listener.taps:
                copies.close(linger=0)

    def judge(self, listener: _Listener, batch: list[tuple[int, int]], now: float) -> list[Refused]:
        """Refused connections in one batch; one whose socket was gone before we looked waits in `unresolved`."""
        gone_at = {value: i for i, (event, value) in enumerate(batch) if event == zmq.EVENT_DISCONNECTED}
        refused = []
        for i, (event, value) in enumerate(batch):
            if event == zmq.EVENT_ACCEPTED:  # a DISCONNECTED later in the batch: the fd may be another's already
                listener.accepted(value, peer_of(value, listener.port) if gone_at.get(value, -1) < i else None)
            elif event & SETTLED:
                listener.settle()
            elif event & FAILED:
                listener.failure = failure(event, value)
            elif event == zmq.EVENT_DISCONNECTED:
                refused += self.disconnected(listener, value, now)
        return refused

    def disconnected(self, listener: _Listener, fd: int, now: float) -> list[Refused]:
        """The refused connection this DISCONNECTED ends, if it is one and its peer is known by now."""
        peer = listener.peers.pop(fd, None)
        if peer is not None:
            self.known[Closed(listener.port, *peer)] = now
        why = listener.closed(fd)
        if why is None:
            return []
        if peer is not None or not listener.port:
            return [Refused(listener.domain, peer[0] if peer else LOCAL, *why)]
        self.unresolved.append(_Unresolved(now, listener.port, Refused(listener.domain, UNKNOWN, *why)))
        return []

    def resolve(self, now: float) -> list[Refused]:
        """Refused connections closed before we looked, matched each to a socket freed on its port lately that was
        none of the peers we did read; none within PATIENCE_S: the peer stays UNKNOWN."""
        found, waiting = [], []
        for unresolved in self.unresolved:
            match = next((closed for _, closed in self.freed
                          if closed.port == unresolved.port and closed not in self.known), None)
            if match is not None:
                self.known[match] = now
                found.append(unresolved.refused._replace(peer=match.ip))
            elif now - unresolved.at >= PATIENCE_S:
                found.append(unresolved.refused)
            else:
                waiting.append(unresolved)
        self.unresolved = waiting
        return found


def watch_of(sock: zmq.Socket[object]) -> PeerWatch | None:
    """The watch started in `sock`'s context, if any: with one, every CURVE server made there is watched."""
    return _WATCHES.get(sock.context.underlying)


def monitor_socket(sock: S, events: int) -> S:
    """`sock.get_monitor_socket(events)`; for a watched socket a copy of the watch's monitor instead, since libzmq
    gives a socket one monitor only (a second would silently replace the first)."""
    watch = watch_of(sock)
    tap = watch.tap(sock, events) if watch is not None else None
    return tap if tap is not None else sock.get_monitor_socket(events)


def _endpoint() -> str:
    return f"inproc://elasticd-peer-watch-{os.getpid()}-{next(_ids)}"
