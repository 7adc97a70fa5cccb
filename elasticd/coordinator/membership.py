"""Membership state the coordinator owns: node records, rounds with sticky rank maps, and its store."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Protocol, cast

from elasticd.wire.member_state import RankReport, WorkerInfo
from elasticd.wire.names import RESTART_CAUSES, Cause, JobState, NodeStatus, Role
from elasticd.wire.read_replies import RoundInfo
from elasticd.wire.record import Record

TALLIED = frozenset({"role", "status"})  # the fields that move a record between `node_counts` groups
# What a store keeps of a node (etcd_store.py), in this order: what a takeover needs of it. The rest is live state
# (last_seen, worker records, metrics) and comes back with the next heartbeats.
KEPT = ("node_id", "host", "nproc", "instance", "joined_seq", "node_rank", "role", "status", "ports", "control", "pub",
        "store_tunnel", "relay_endpoint", "via", "restarts")
_KEPT = frozenset(KEPT)


@dataclass
class NodeRecord:
    """One member as the coordinator sees it: who it is, where it is wanted, and what it last reported."""

    node_id: str
    host: str
    nproc: int
    instance: str  # a fresh id per daemon start: tells a restarted daemon from a duplicate node id
    joined_seq: int
    node_rank: int = -1  # torchrun's --node-rank: a fixed place in the rank map; -1: none
    role: Role = Role.active
    status: NodeStatus = NodeStatus.alive
    last_seen: float = 0.0
    ports: list[int] = field(default_factory=list)
    control: str = ""
    pub: str = ""
    store_tunnel: str = ""  # with --keys: the ROUTER other nodes reach this node's round store through
    relay_endpoint: str = ""  # in a job with relays: where this node relays for others, if it is told to
    via: str = ""  # the node it sends through (its relay); "": the coordinator directly
    workers: list[WorkerInfo] = field(default_factory=list)
    metrics: dict[str, RankReport] = field(default_factory=dict)  # by rank
    restarts: dict[Cause, int] = field(default_factory=lambda: dict.fromkeys(RESTART_CAUSES, 0))  # its workers

    def __setattr__(self, name: str, value: Any) -> None:
        # A tallied record tells its tally (tally.py) when it changes group: counts cost O(1), not a scan;
        # a stored one tells its store (`_changed`, etcd_store.py) a kept field changed: a sync writes only those.
        tally = self.__dict__.get("_tally") if name in TALLIED else None
        before = self.group() if tally is not None else ""
        object.__setattr__(self, name, value)
        if tally is not None:
            tally.moved(before, self.group())
        if name in _KEPT and (changed := self.__dict__.get("_changed")) is not None:
            changed.add(self.node_id)

    def group(self) -> str:
        """Its group in `status`'s `node_counts`: `alive/<role>`, or `lost`, or `left`."""
        return f"{self.status}/{self.role}" if self.status == NodeStatus.alive else str(self.status)

    def public(self, now: float) -> dict[str, Any]:
        """The record as `status` shows it: shallow (it is encoded at once), not asdict's deep copy of every
        worker record and metric, which cost most of a `status` at thousands of nodes."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "ports"}
        data["restarts"] = dict(self.restarts)
        data["last_seen_age_s"] = round(max(0.0, now - self.last_seen), 3)
        return data


@dataclass
class RankEntry:
    """One node's place in a round: its group rank and its global ranks."""

    node_id: str
    group_rank: int
    host: str
    ranks: list[int]


@dataclass
class Round:
    """One membership epoch: its members and rank map, its master, and its timeline."""

    round_id: int
    members: list[RankEntry]
    world_size: int
    master_addr: str
    master_port: int
    cause: Cause
    detail: str
    started_at: float
    timeline: dict[str, float] = field(default_factory=dict)

    @cached_property
    def _by_node(self) -> dict[str, RankEntry]:  # members never change once a round is formed
        return {e.node_id: e for e in self.members}

    def entry(self, node_id: str) -> RankEntry | None:
        return self._by_node.get(node_id)

    def has(self, node_id: str) -> bool:
        return node_id in self._by_node

    def node_ids(self) -> list[str]:
        return list(self._by_node)

    def public(self) -> RoundInfo:
        """As `status` and `ranks` show it; built by hand: asdict's deep copy of every member was most of a
        `status` summary at 2,048 nodes (the records are encoded at once, never kept)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["members"] = [vars(e).copy() for e in self.members]
        data["timeline"] = dict(self.timeline)
        return cast(RoundInfo, data)  # its fields are RoundInfo's, by name


def sticky_order(previous: list[str], candidates: list[NodeRecord]) -> list[str]:
    """Survivors keep their relative order; newcomers follow in the order they joined."""
    present = {n.node_id for n in candidates}
    kept = [node for node in previous if node in present]
    was = set(kept)
    newcomers = sorted((n for n in candidates if n.node_id not in was), key=lambda n: n.joined_seq)
    return kept + [n.node_id for n in newcomers]


def build_rank_map(order: list[str], nodes: dict[str, NodeRecord]) -> tuple[list[RankEntry], int]:
    """Nodes with a --node-rank come first, by node rank; the rest keep `order` (sticky, then join order)."""
    ranked = sorted((n for n in order if nodes[n].node_rank >= 0), key=lambda n: nodes[n].node_rank)
    entries, base = [], 0
    for group_rank, node_id in enumerate(ranked + [n for n in order if nodes[n].node_rank < 0]):
        node = nodes[node_id]
        entries.append(RankEntry(node_id, group_rank, node.host, list(range(base, base + node.nproc))))
        base += node.nproc
    return entries, base


class MembershipStore(Protocol):
    """What the coordinator persists. The embedded store keeps it in memory; etcd can replace it for HA."""

    def nodes(self) -> dict[str, NodeRecord]: ...
    def put_node(self, node: NodeRecord) -> None: ...
    def rounds(self) -> list[Round]: ...
    def put_round(self, rnd: Round) -> None: ...


class MemoryStore:
    """The embedded single-coordinator store; keeps the last `history` rounds."""

    def __init__(self, history: int = 50) -> None:
        self._nodes: dict[str, NodeRecord] = {}
        self._rounds: list[Round] = []
        self._history = history

    def nodes(self) -> dict[str, NodeRecord]:
        return self._nodes

    def put_node(self, node: NodeRecord) -> None:
        self._nodes[node.node_id] = node

    def rounds(self) -> list[Round]:
        return self._rounds

    def put_round(self, rnd: Round) -> None:
        self._rounds.append(rnd)
        del self._rounds[: -self._history]


@dataclass(frozen=True)
class StoredJob(Record):
    """The job's counters as etcd holds them (`state/job`): what a takeover restores besides nodes and rounds."""

    target: int
    restarts: dict[str, int]
    used_ports: list[int]
    state: JobState
    reason: str
    join_seq: int
    coordinator: str = ""  # the daemon that wrote it: a takeover's `coordinator_elected` names it (restore needs none)
