"""The coordinator's state in etcd, written only through a transaction fenced on the coordinator's epoch.

Layout under `/elasticd/<job>/` (docs/architecture.md, "Coordinator failover"):
`state/job` (target, restarts by cause, used ports, state, join counter), `state/nodes/<id>`, `state/rounds/<n>`,
`state/events/<seq>`; `leader/<lease>` and `alive/<node>` belong to the election
(elasticd/coordinator/etcd/election.py).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from elasticd.coordinator.etcd.client import EtcdClient, TxnOp, created_at, delete, put
from elasticd.coordinator.etcd.errors import EtcdUnavailable
from elasticd.coordinator.membership import KEPT, NodeRecord, RankEntry, Round
from elasticd.job.events import seq_of
from elasticd.wire.names import Cause, NodeStatus, Role
from elasticd.wire.protocol import JsonObject

log = logging.getLogger("elasticd")
TXN_OPS = 100  # etcd refuses a txn of more than --max-txn-ops (128 by default)
ROUND_WRITE_TIMEOUT_S = 3.0  # a round is sent only once etcd holds it: this long at most, else no round
RETRY_S = 0.2


class Deposed(Exception):
    """A fenced write failed: another daemon holds a newer epoch. This coordinator must stop acting at once."""


class StoreUnavailable(Exception):
    """etcd did not take a write in time; what the coordinator decided was not made durable."""


def job_prefix(job_id: str) -> str:
    return f"/elasticd/{job_id}/"


# Records as this store wrote them (node_value, Round.public), read back with no check per field: a takeover reads up
# to 2,048 nodes and 50 rounds of 2,048 members, where a wire Record's checks would cost about a second.
def node_record(data: dict[str, Any]) -> NodeRecord:
    fields = {k: data[k] for k in KEPT if k in data}
    fields["role"], fields["status"] = Role(fields["role"]), NodeStatus(fields["status"])
    fields["restarts"] = {Cause(k): int(v) for k, v in fields.get("restarts", {}).items()}
    return NodeRecord(**fields)


def round_record(data: dict[str, Any]) -> Round:
    members = [RankEntry(**m) for m in data["members"]]
    return Round(int(data["round_id"]), members, int(data["world_size"]), str(data["master_addr"]),
                 int(data["master_port"]), Cause(data["cause"]), str(data["detail"]), float(data["started_at"]),
                 {k: float(v) for k, v in data.get("timeline", {}).items()})


@dataclass
class Snapshot:
    """Everything a new coordinator rebuilds from: what the last one made durable, and who is alive now."""

    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    rounds: list[Round] = field(default_factory=list)
    job: JsonObject = field(default_factory=dict)
    events: list[JsonObject] = field(default_factory=list)
    alive: dict[str, str] = field(default_factory=dict)  # node id -> the instance whose lease holds its key

    @classmethod
    def read(cls, client: EtcdClient, prefix: str) -> Snapshot:
        snap = cls()
        kvs, _rev = client.get_prefix(prefix)
        for kv in kvs:
            rest = kv.key[len(prefix):]
            if rest.startswith("alive/"):
                snap.alive[rest[len("alive/"):]] = kv.value.decode()
                continue
            if not rest.startswith("state/"):
                continue
            data = json.loads(kv.value)
            kind = rest[len("state/"):].split("/", 1)[0]
            if kind == "nodes":
                snap.nodes[data["node_id"]] = node_record(data)
            elif kind == "rounds":
                snap.rounds.append(round_record(data))
            elif kind == "events":
                snap.events.append(data)
            elif kind == "job":
                snap.job = data
        snap.rounds.sort(key=lambda r: r.round_id)
        snap.events.sort(key=seq_of)
        return snap


@dataclass
class Batch:
    """Writes that go to etcd in one fenced transaction, and who waits for them."""

    ops: list[TxnOp]
    done: Future[None] | None = None  # a caller waiting for this batch (a round)


class EtcdStore:
    """A `MembershipStore` whose every write is a txn on `leader key == epoch`, in the order it was made.

    Reads are from memory (the coordinator's loop never waits on etcd for them). `put_round` waits until etcd
    holds the round, its restart counters and every change before it; everything else is written by `sync`,
    which the daemon calls from its tick, in the background, in order.
    """

    def __init__(self, client: EtcdClient, prefix: str, leader_key: str, epoch: int, history: int = 50,
                 event_capacity: int = 5000, snapshot: Snapshot | None = None, fresh: bool = False) -> None:
        self.client, self.prefix = client, prefix
        self.fence = created_at(leader_key, epoch)
        self.history, self.event_capacity = history, event_capacity
        snap = snapshot or Snapshot()
        self._nodes: dict[str, NodeRecord] = dict(snap.nodes)
        self._rounds: list[Round] = list(snap.rounds)
        self.written: dict[str, bytes] = {}  # key -> the value etcd has (so only changes are written)
        # What changed since the last sync: a sync encodes only these (encoding every record each 0.1 s was a
        # quarter of a core at 2,048 nodes). Records add their own id when a kept field changes (membership.py).
        self.changed: set[str] = set()
        self.timelines: dict[int, tuple[tuple[str, float], ...]] = {}  # round -> the timeline etcd has
        for node in snap.nodes.values():
            node.__dict__["_changed"] = self.changed
            self.written[self.node_key(node.node_id)] = self.node_value(node)
        for rnd in snap.rounds:
            self.written[self.round_key(rnd.round_id)] = encode(rnd.public())
            self.timelines[rnd.round_id] = tuple(rnd.timeline.items())
        self.events_written = seq_of(snap.events[-1]) if snap.events else 0
        self.oldest_written = snap.rounds[0].round_id if snap.rounds else 0  # rounds below it are gone from etcd
        self.job_state: Callable[[], JsonObject] = lambda: {}
        self.events_since: Callable[[int], list[JsonObject]] = lambda _seq: []
        self.deposed = False
        self.unavailable_since = 0.0  # when a write last failed for want of etcd; 0: writes go through
        self.queue: queue.Queue[Batch | None] = queue.Queue()
        if fresh:  # a finished job's state under the same id goes before the new run writes anything
            self.queue.put(Batch([delete(f"{prefix}state/", f"{prefix}state0")]))  # '0' follows '/'
        self.writer = threading.Thread(target=self._write_loop, name="etcd-store", daemon=True)
        self.writer.start()

    # ---- keys -----------------------------------------------------------------------------------
    def node_key(self, node_id: str) -> str:
        return f"{self.prefix}state/nodes/{node_id}"

    def round_key(self, round_id: int) -> str:
        return f"{self.prefix}state/rounds/{round_id:010d}"

    def event_key(self, seq: int) -> str:
        return f"{self.prefix}state/events/{seq:012d}"

    @staticmethod
    def node_value(node: NodeRecord) -> bytes:
        return encode({k: getattr(node, k) for k in KEPT})

    # ---- MembershipStore ----------------------------------------------------------------------------
    def nodes(self) -> dict[str, NodeRecord]:
        return self._nodes

    def put_node(self, node: NodeRecord) -> None:
        self._nodes[node.node_id] = node  # written by the next sync, and again by the one after each change
        node.__dict__["_changed"] = self.changed  # not a field: `public`, `asdict` and equality never see it
        self.changed.add(node.node_id)

    def rounds(self) -> list[Round]:
        return self._rounds

    def put_round(self, rnd: Round) -> None:
        """Durable before it returns: the round, the job's counters and every change made before it."""
        self._rounds.append(rnd)
        del self._rounds[: -self.history]
        done: Future[None] = Future()
        self.queue.put(Batch(self.changes(), done))
        try:
            done.result(ROUND_WRITE_TIMEOUT_S)
        except FutureTimeout:
            raise StoreUnavailable(f"etcd did not take round {rnd.round_id} within {ROUND_WRITE_TIMEOUT_S:g}s") \
                from None

    # ---- writing ------------------------------------------------------------------------------------
    def sync(self) -> None:
        """Queue what changed since the last write (roles, statuses, the round's timeline, new events)."""
        ops = self.changes()
        if ops:
            self.queue.put(Batch(ops))

    def changes(self) -> list[TxnOp]:
        ops = []
        changed = [self._nodes[n] for n in self.changed if n in self._nodes]
        self.changed.clear()  # the same set: every record holds it
        values = {self.node_key(n.node_id): self.node_value(n) for n in changed}
        for rnd in self._rounds[-2:]:  # a round changes only its timeline once formed
            timeline = tuple(rnd.timeline.items())
            if self.timelines.get(rnd.round_id) != timeline:
                self.timelines[rnd.round_id] = timeline
                values[self.round_key(rnd.round_id)] = encode(rnd.public())
        values[f"{self.prefix}state/job"] = encode(self.job_state())
        for key, value in values.items():
            if self.written.get(key) != value:
                self.written[key] = value
                ops.append(put(key, value))
        oldest = self._rounds[0].round_id if self._rounds else 0
        if oldest > self.oldest_written:  # rounds that fell out of the history go (once, not every sync)
            self.oldest_written = oldest
            ops.append(delete(self.round_key(0), self.round_key(oldest)))
        events = self.events_since(self.events_written)
        if events:
            self.events_written = seq_of(events[-1])
            ops += [put(self.event_key(seq_of(e)), encode(e)) for e in events]
            if self.events_written > self.event_capacity:  # compaction: the log keeps what the daemon's does
                ops.append(delete(self.event_key(0), self.event_key(self.events_written - self.event_capacity + 1)))
        return ops

    def close(self, timeout_s: float = 2.0) -> None:
        """Write what is queued (a resigning coordinator's last word), then stop the writer."""
        self.sync()
        self.queue.put(None)
        self.writer.join(timeout_s)

    def _write_loop(self) -> None:
        while (batch := self.queue.get()) is not None:
            for start in range(0, max(len(batch.ops), 1), TXN_OPS):
                self._write(batch.ops[start:start + TXN_OPS])
            if batch.done is not None and not batch.done.done():
                if self.deposed:
                    batch.done.set_exception(Deposed("a newer coordinator holds the job"))
                else:
                    batch.done.set_result(None)

    def _write(self, ops: list[TxnOp]) -> None:
        """One fenced txn, retried while etcd is away; a failed compare deposes this coordinator for good."""
        while ops and not self.deposed:
            try:
                result = self.client.txn([self.fence], ops)
            except EtcdUnavailable as exc:
                if not self.unavailable_since:
                    self.unavailable_since = time.time()
                    log.warning("etcd: coordinator state not written: %s", exc)
                time.sleep(RETRY_S)
                continue
            except Exception as exc:  # another cluster, a refused request: nothing this writer can fix
                log.error("etcd: coordinator state not written: %s", exc)
                self.deposed = True
                return
            self.unavailable_since = 0.0
            if not result.get("succeeded"):
                log.warning("etcd: a fenced write failed: a newer coordinator holds the job")
                self.deposed = True
            return


def encode(data: object) -> bytes:
    return json.dumps(data, separators=(",", ":"), sort_keys=True, default=str).encode()

