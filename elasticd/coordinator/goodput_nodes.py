"""Goodput by node: each node's own time in the job, by the job's buckets while it held ranks, idle while it held none.

docs/architecture.md, "Goodput". A node's time starts at its `node_joined` and ends at its `node_left` or
`node_lost`. While its node is in the round's rank map it is spent as the job's is (training, checkpoint,
recovery...); while it is not (standby beyond `--nnodes` max, cordoned, waiting to be let in) it is idle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from elasticd.wire.protocol import Json
from elasticd.wire.read_replies import NodeGoodput

IDLE = "idle"  # a node in the job holding no ranks: paid for, training nothing
TRAINING = "training"


class NodeTotals(TypedDict):
    """What a `goodput` event carries of the nodes: each one's seconds by bucket, and when each joined."""

    node_totals: dict[str, dict[str, float]]
    node_joined: dict[str, float]


class NodeTime:
    """Per node: seconds by bucket over its time in the job, accounted at each stretch the ledger closes."""

    def __init__(self) -> None:
        self.joined: dict[str, float] = {}  # node id -> when it joined, while it is in the job
        self.left: dict[str, float] = {}  # node id -> when it left or was lost, until its last stretch closes
        self.ranks: dict[str, int] = {}  # node id -> its ranks in the current round
        self.totals: dict[str, dict[str, float]] = {}  # node id -> bucket -> seconds

    def joined_at(self, node_id: str, ts: float) -> None:
        self.joined.setdefault(node_id, ts)
        self.left.pop(node_id, None)

    def left_at(self, node_id: str, ts: float) -> None:
        if node_id in self.joined:
            self.left[node_id] = ts

    def round_ranks(self, rank_map: Mapping[str, Json], ts: float) -> None:
        """The round's rank map ({node: [ranks]}); a member the log never saw join is in the job from now."""
        self.ranks = {str(n): len(r) for n, r in rank_map.items() if isinstance(r, list)}
        for node_id in self.ranks:
            self.joined.setdefault(node_id, ts)

    def account(self, start: float, end: float, seconds: dict[str, float]) -> None:
        """A closed stretch of the job: its buckets to each node with ranks, idle to each node without."""
        span = end - start
        if span <= 0:
            return
        for node_id, since in list(self.joined.items()):
            until = min(end, self.left.get(node_id, end))
            share = max(0.0, until - max(start, since)) / span  # the part of the stretch this node was in the job
            totals = self.totals.setdefault(node_id, {})
            if share and node_id in self.ranks:
                for bucket, value in seconds.items():
                    totals[bucket] = totals.get(bucket, 0.0) + value * share
            elif share:
                totals[IDLE] = totals.get(IDLE, 0.0) + span * share
            if node_id in self.left:
                del self.joined[node_id], self.left[node_id]

    def report(self, live: dict[str, dict[str, float]], limit: int) -> list[NodeGoodput]:
        """The `limit` nodes with the lowest goodput first (all for a negative limit), the open stretch included."""
        rows: list[tuple[float, str, NodeGoodput]] = []  # (goodput, or 2 for none: last; node id; the row)
        for node_id in set(self.totals) | set(live):
            seconds = dict(self.totals.get(node_id, {}))
            for bucket, value in live.get(node_id, {}).items():
                seconds[bucket] = seconds.get(bucket, 0.0) + value
            total = sum(seconds.values())
            goodput = round(seconds.get(TRAINING, 0.0) / total, 4) if total else None
            lost = {k: round(v, 3) for k, v in sorted(seconds.items()) if k not in (TRAINING, IDLE) and v > 5e-4}
            row: NodeGoodput = {"node": node_id, "goodput": goodput, "seconds": round(total, 3),
                               "idle": round(seconds.get(IDLE, 0.0), 3), "lost": lost}
            rows.append((goodput if goodput is not None else 2.0, node_id, row))
        rows.sort(key=lambda r: r[:2])
        return [row for *_, row in (rows if limit < 0 else rows[:limit])]

    def live(self, start: float, end: float, seconds: dict[str, float]) -> dict[str, dict[str, float]]:
        """The open stretch as `account` would spend it, changing nothing."""
        probe = NodeTime()
        probe.joined, probe.left, probe.ranks = dict(self.joined), dict(self.left), self.ranks
        probe.account(start, end, seconds)
        return probe.totals

    def state(self) -> NodeTotals:
        return {"node_totals": {n: {b: round(v, 3) for b, v in t.items()} for n, t in self.totals.items()},
                "node_joined": dict(self.joined)}

    def resume(self, event: Mapping[str, Json]) -> None:
        by_node = event.get("node_totals")
        self.totals = {str(n): seconds_of(t) for n, t in by_node.items()} if isinstance(by_node, Mapping) else {}
        self.joined = seconds_of(event.get("node_joined"))
        self.left = {}


def seconds_of(value: Json) -> dict[str, float]:
    """A `goodput` event's seconds by key (bucket, node) as it reads back; a value that is no number is left out."""
    if not isinstance(value, Mapping):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, int | float)}
