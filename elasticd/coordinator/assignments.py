"""What each member is told of a round: the fields they all share, and each node's own part over them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from elasticd.coordinator.membership import NodeRecord, Round
from elasticd.wire.assignment import NodePart, RoundAssignment
from elasticd.wire.names import JobState, Role


def shared_fields(rnd: Round, nodes: Mapping[str, NodeRecord], restart_count: int, max_restarts: int,
                  resize: dict[str, Any]) -> RoundAssignment:
    """The round's assignment as every member gets it, before its own part; `resize`: the resizer's fields."""
    return RoundAssignment(
        rnd.round_id, JobState.running, group_world_size=len(rnd.members), world_size=rnd.world_size,
        master_addr=rnd.master_addr, master_port=rnd.master_port, restart_count=restart_count,
        max_restarts=max_restarts,
        store_tunnel=nodes[rnd.members[0].node_id].store_tunnel,  # rank 0's node: it hosts the store
        **resize)


def node_part(rnd: Round, node: NodeRecord, hot_spare: Callable[[Round, bool], bool]) -> NodePart:
    """One node's own fields: its state, group rank and ranks, its restarts, whether it is a hot spare."""
    entry = rnd.entry(node.node_id)
    restarts = cast(dict[str, int], dict(node.restarts))  # its metrics (daemon/exporter.py); a Cause is a str
    if entry is not None:  # a member: built as the literal a NodePart is, without a call per field
        return {"state": JobState.running, "group_rank": entry.group_rank, "ranks": entry.ranks,
                "node_restarts": restarts, "prewarm": False, "expected_world": 0}
    prewarm = hot_spare(rnd, node.role == Role.standby)
    return {"state": node.role, "group_rank": None, "ranks": [], "node_restarts": restarts, "prewarm": prewarm,
            "expected_world": expected_world(rnd, node) if prewarm else 0}


def expected_world(rnd: Round, node: NodeRecord) -> int:
    """The world a node's pre-started workers expect to join, which a sharded script rehearses: the round's, and
    this node's processes."""
    return rnd.world_size + node.nproc
