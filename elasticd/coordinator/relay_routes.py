"""The coordinator's side of relays in a large job: each member told its route, held to it, and moved when it goes."""

from __future__ import annotations

import logging

from elasticd.coordinator.core import CoordinatorCore
from elasticd.coordinator.membership import NodeRecord
from elasticd.coordinator.relay_plan import RelayPlan
from elasticd.wire.member_state import Heartbeat
from elasticd.wire.names import EventKind, MeshOp, NodeStatus

log = logging.getLogger("elasticd")


class RelayRoutes:
    """Keeps the members on the routes of the relay plan (relay_plan.py): places a newcomer, tells a member that
    sends elsewhere its route again, and moves a departed relay's members behind the next of them."""

    def __init__(self, core: CoordinatorCore) -> None:
        self.core = core
        self.plan = RelayPlan(core.cfg.relay_size)  # which members send through which
        self.told: dict[str, float] = {}  # member -> when it was last sent `relay` for a route it lacks

    def place(self, node: NodeRecord) -> None:
        """A registering node's relay, as its record's `via`."""
        if node.node_id != self.core.cfg.node_id:  # our own node is in process: no link to relay
            node.via = self.plan.place(node.node_id, bool(node.relay_endpoint))

    def via_endpoint(self, node: NodeRecord) -> str:
        """Where the member sends through: its relay's endpoint, or "" (the coordinator itself)."""
        relay = self.core.nodes.get(node.via) if node.via else None
        return relay.relay_endpoint if relay is not None and relay.status == NodeStatus.alive else ""

    def check_route(self, node: NodeRecord, beat: Heartbeat, now: float) -> None:
        """The member sends where it was told (`relay` again, at most once a heartbeat interval, if not); one
        that could not reach its relay talks to us directly from now on."""
        cfg = self.core.cfg
        want = self.via_endpoint(node)
        if want and beat.via_failed == want:
            log.warning("[%s] node %s could not reach its relay %s (%s); it talks to the coordinator directly",
                        cfg.node_id, node.node_id, node.via, want)
            self.plan.direct(node.node_id)
            node.via, want = "", ""
        if beat.via != want and now - self.told.get(node.node_id, 0.0) > cfg.heartbeat_s:
            self.told[node.node_id] = now
            self.core.send(node.node_id, MeshOp.relay, {"via": want})

    def replace_relay(self, node_id: str, now: float) -> None:
        """A relay went: the first of its group (join order) relays for the others now. Each moved member gets time
        to switch links: its link to a dead relay dropped with it, one to a relay cut off from us did not
        (Member.leave_a_silent_relay)."""
        nodes = self.core.nodes
        self.told.pop(node_id, None)
        successor, moved = self.plan.remove(node_id, lambda n: (not nodes[n].relay_endpoint, nodes[n].joined_seq))
        if not moved:
            return
        for member in sorted(moved):
            record = nodes[member]
            record.via = self.plan.via.get(member, "")
            # A loss limit to notice (a relay cut off from us keeps its members' links up) and one to switch.
            record.last_seen = max(record.last_seen, now + self.core.cfg.lost_after_s)
            self.told[member] = now
            self.core.send(member, MeshOp.relay, {"via": self.via_endpoint(record)})
        self.core.emit(EventKind.relay_replaced, node_id, relay=successor, nodes=len(moved))

    def relay_silent(self, node: NodeRecord, now: float) -> bool:
        """Its relay's own beats are late too (2 intervals): the member's silence may be the relay's."""
        relay = self.core.nodes.get(node.via) if node.via else None
        return relay is not None and relay.status == NodeStatus.alive \
            and now - relay.last_seen > 2 * self.core.cfg.heartbeat_s
