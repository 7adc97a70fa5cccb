"""How many nodes are in each group (alive/<role>, lost, left), kept as records change: O(1) per registration."""

from __future__ import annotations

from elasticd.coordinator.membership import NodeRecord
from elasticd.wire.names import NodeStatus, Role

ACTIVE = f"{NodeStatus.alive}/{Role.active}"


class NodeTally:
    """Counts the coordinator's node records by group; a record added here reports its own moves (`moved`)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.total = 0

    def add(self, node: NodeRecord, replaces: NodeRecord | None = None) -> None:
        if replaces is not None and replaces.__dict__.pop("_tally", None) is self:
            self._bump(replaces.group(), -1)
        node.__dict__["_tally"] = self  # not a field: `public`, `asdict` and equality never see it
        self._bump(node.group(), 1)

    def moved(self, before: str, after: str) -> None:
        if before != after:
            self._bump(before, -1)
            self._bump(after, 1)

    def count(self, group: str) -> int:
        return self.counts.get(group, 0)

    def groups(self) -> dict[str, int]:
        return {group: n for group, n in self.counts.items() if n}

    def rebuild(self, nodes: dict[str, NodeRecord]) -> NodeTally:
        """Recount from scratch when records arrived other than through `add` (a store filled behind us)."""
        if self.total != len(nodes):
            for node in nodes.values():
                node.__dict__.pop("_tally", None)
            self.counts, self.total = {}, 0
            for node in nodes.values():
                self.add(node)
        return self

    def _bump(self, group: str, by: int) -> None:
        self.counts[group] = self.counts.get(group, 0) + by
        self.total += by
