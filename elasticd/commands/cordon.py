"""`cordon NODE` keeps a node out of the next rounds; `uncordon NODE` lets it back in."""

from typing import Any

from elasticd import steer
from elasticd.commands import Command
from elasticd.coordinator import Coordinator
from elasticd.names import Cause, EventKind, JobState, NodeStatus, Role
from elasticd.protocol import ErrorCode, arg


def cordon(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    node = arg(args, "node", str)
    if node not in c.nodes:
        raise steer.refuse(f"no node '{node}' in job '{c.cfg.job_id}'", ErrorCode.NOT_FOUND)
    in_round = c.round is not None and node in c.round.node_ids() and c.state == JobState.running
    dry = bool(arg(args, "dry_run", bool, False))
    if not in_round:
        if not dry:
            c.nodes[node].role = Role.cordoned
            c.emit(EventKind.node_role, node, role=Role.cordoned)
        return {"ok": True, "dry_run": dry, "plan": {"summary": f"node {node} cordoned; the world is unchanged"}}
    steer.check_leave(c, [node], bool(arg(args, "force", bool, False)))
    plan = steer.plan(c, [n for n in c.round.node_ids() if n != node])
    if dry:
        return {"ok": True, "dry_run": True, "plan": plan}
    return {**steer.begin(c, "cordon", [node], "cordoned", "round", f"cordon of {node}"), "plan": plan}


def uncordon(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    node = arg(args, "node", str)
    record = c.nodes.get(node)
    if record is None:
        raise steer.refuse(f"no node '{node}' in job '{c.cfg.job_id}'", ErrorCode.NOT_FOUND)
    trans = c.transition
    if trans is not None and node in trans.leaving:
        raise steer.refuse(f"a {trans.kind} of {node} is in progress (op {trans.op_id}); uncordon it once "
                           f"its {trans.events.complete} event arrives")
    if record.role != Role.cordoned:
        raise steer.refuse(f"node '{node}' is not cordoned (role {record.role})", ErrorCode.BAD_ARGUMENT)
    dry = bool(arg(args, "dry_run", bool, False))
    if not dry:
        record.role = Role.standby
        c.emit(EventKind.node_role, node, role=Role.standby)
        active = sum(1 for n in c.alive() if n.role == Role.active)
        if record.status == NodeStatus.alive and active < c.target:
            c.schedule(Cause.membership, f"uncordon of {node}", c.clock())
    return {"ok": True, "dry_run": dry, "plan": {"summary": f"node {node} may join the next rounds (as standby)"}}


COMMANDS = [
    Command("cordon", True, cordon, "keep NODE out of the next rounds"),
    Command("uncordon", True, uncordon, "let NODE back into the next rounds"),
]
