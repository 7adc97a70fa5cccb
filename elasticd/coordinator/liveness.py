"""Noticing a dead member: a closed connection not back within a grace, missed heartbeats, our own loop's stalls."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from elasticd.coordinator.core import CoordinatorCore
from elasticd.coordinator.membership import NodeRecord
from elasticd.job.events import EventLog
from elasticd.wire.names import MeshOp, NodeStatus

log = logging.getLogger("elasticd")
STALL_S = 1.0  # a tick this late means the coordinator's own loop stood still
# A member's connection that closes and is back within this long (a reset link; the DEALER reconnects in
# ~100 ms) costs nothing; one still closed then is a dead daemon. docs/architecture.md, "Noticing a dead node".
RECONNECT_GRACE_S = 0.5


class LivenessCore(CoordinatorCore, Protocol):
    """What liveness needs of the coordinator besides the core: the job log's sequence, and a node's removal."""

    events: EventLog

    def remove(self, node_id: str, status: NodeStatus, detail: str, now: float, reform: bool = True) -> None: ...


class Liveness:
    """Judges which members are gone: by the mesh's word that a connection closed (and stayed closed), or by
    their silence past the heartbeat limit; a silence that is our own loop's or a late relay's is not theirs."""

    def __init__(self, core: LivenessCore, connected: Callable[[str], bool],
                 relay_silent: Callable[[NodeRecord, float], bool], awaited: Callable[[str], bool]) -> None:
        self.core = core
        self.awaited = awaited  # a peer's failure awaits this node's `pong` (probes.py): no grace for it
        # Whether a node's daemon has a live mesh connection now (the mesh asks its ROUTER); with no mesh to
        # ask, a connection reported closed stays closed.
        self.connected = connected
        self.relay_silent = relay_silent
        self.closed: dict[str, float] = {}  # node id -> when the mesh saw its connection close
        self.last_tick = 0.0
        self.liveness_due = 0.0  # no member can have been silent past the limit before this (check_liveness)

    def credit_stall(self, now: float) -> None:
        """Our own loop stood still (a GC pause, SIGSTOP, a long burst): the members' silence then is not theirs."""
        core = self.core
        gap = now - self.last_tick if self.last_tick else 0.0
        self.last_tick = now
        if gap > STALL_S:
            log.warning("[%s] the coordinator did not run for %.1fs; members get that time back before any of "
                        "them is judged lost", core.cfg.node_id, gap)
            alive = core.alive()
            for node in alive:
                node.last_seen += gap
            # The members judge our silence too (member.py): a sign of life now, not at each one's next answer.
            rnd = core.round
            core.send_all([n.node_id for n in alive if n.node_id != core.cfg.node_id], MeshOp.hb,
                          {"seq": core.events.seq, "round": rnd.round_id if rnd else 0})

    def check_liveness(self, now: float) -> None:
        """A closed connection not back within the grace, or (a frozen or cut-off node) missed heartbeats."""
        cfg = self.core.cfg
        for node_id, since in list(self.closed.items()):
            if now - since >= RECONNECT_GRACE_S and not self.lose_if_closed(node_id, now):
                del self.closed[node_id]  # it reconnected within the grace: a blip, not a death
                self.liveness_due = 0.0  # its silence counts again, from its last frame
        if now < self.liveness_due:
            return  # no member can be silent past the limit before then: a scan of all, every 50 ms tick, cost CPU
        oldest = now
        for node in self.core.alive():
            if node.node_id == cfg.node_id or node.node_id in self.closed:
                continue  # a closed connection is judged above, within the grace, and for what it is
            if now - node.last_seen <= cfg.lost_after_s:
                oldest = min(oldest, node.last_seen)
            elif self.relay_silent(node, now):  # its frames wait at a relay that is late itself: not its silence
                oldest = min(oldest, now - cfg.lost_after_s + cfg.heartbeat_s)
            else:
                self.core.remove(node.node_id, NodeStatus.lost, f"node {node.node_id} missed "
                                 f"{cfg.heartbeat_misses} heartbeats", now)
        # last_seen only moves forward, and a node added later is seen later: none is due before this
        self.liveness_due = oldest + cfg.lost_after_s

    def connection_lost(self, node_id: str, now: float) -> None:
        """The mesh saw this member's connection close: its daemon died, or its link reset. Lost once the reconnect
        grace passes without it back, or at once when a peer's failure awaits its `pong` (that round is failing
        anyway, and a closed connection never answers)."""
        node = self.core.nodes.get(node_id)
        if node is None or node.status != NodeStatus.alive or node_id == self.core.cfg.node_id:
            return
        self.closed.setdefault(node_id, now)
        if self.awaited(node_id):
            self.lose_if_closed(node_id, now)

    def forget(self, node_id: str) -> None:
        """The member is gone (or removed otherwise): its closed connection is no longer watched."""
        self.closed.pop(node_id, None)

    def lose_if_closed(self, node_id: str, now: float) -> bool:
        """Declare a member whose connection closed lost, unless it has reconnected meanwhile."""
        if self.connected(node_id):
            return False
        self.core.remove(node_id, NodeStatus.lost, f"node {node_id}'s connection closed", now)
        return True

    def lose_closed(self, node_ids: Iterable[str], now: float) -> None:
        """Those of these members whose connection closed are lost now: a closed connection never answers."""
        for node_id in sorted(set(node_ids) & self.closed.keys()):
            self.lose_if_closed(node_id, now)
