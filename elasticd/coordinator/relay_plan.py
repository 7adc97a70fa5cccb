"""Which members relay for which (large jobs): groups of at most `size` members, each behind one member's relay."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from elasticd.coordinator.membership import NodeRecord


@dataclass
class RelayPlan:
    """The coordinator's assignment; relays themselves talk to it directly. `size` 0: no relays at all."""

    size: int
    groups: dict[str, set[str]] = field(default_factory=dict)  # relay node -> the members it relays for
    via: dict[str, str] = field(default_factory=dict)  # member node -> its relay node

    def place(self, node_id: str, can_relay: bool) -> str:
        """A registering node's relay ("": it talks to the coordinator directly): the relay with the fewest members
        while one has room, else the node becomes a relay itself (if it offered an endpoint). O(relays)."""
        if not self.size or node_id in self.groups:
            return ""
        if node_id in self.via:
            return self.via[node_id]
        roomy = [relay for relay, members in self.groups.items() if len(members) < self.size]
        if roomy:
            relay = min(roomy, key=lambda r: len(self.groups[r]))
            self.groups[relay].add(node_id)
            self.via[node_id] = relay
            return relay
        if can_relay:
            self.groups[node_id] = set()
        return ""

    def direct(self, node_id: str) -> None:
        """The member could not reach its relay: it talks to the coordinator directly from now on."""
        relay = self.via.pop(node_id, "")
        if relay:
            self.groups[relay].discard(node_id)

    def remove(self, node_id: str, order: Callable[[str], tuple[int, int]]) -> tuple[str, set[str]]:
        """The node is gone. A relay's members move behind the first of them by `order` (those that can relay
        first, then join order), which becomes the group's relay. Returns that new relay and every node whose relay
        changed (it included)."""
        self.direct(node_id)
        members = self.groups.pop(node_id, None)
        if not members:
            return "", set()
        successor = min(members, key=order)
        members.discard(successor)
        del self.via[successor]
        self.groups[successor] = members
        for member in members:
            self.via[member] = successor
        return successor, members | {successor}

    def via_of(self, node_id: str) -> str:
        return self.via.get(node_id, "")

    def rebuild(self, nodes: Iterable[NodeRecord]) -> None:
        """From the records' `via` (a new coordinator after a takeover, from etcd); a member whose relay is not
        among them talks to the coordinator directly."""
        records = {n.node_id: n for n in nodes}
        self.groups, self.via = {}, {}
        for node in records.values():
            if node.via in records and not records[node.via].via:
                self.groups.setdefault(node.via, set()).add(node.node_id)
                self.via[node.node_id] = node.via
            else:
                node.via = ""
