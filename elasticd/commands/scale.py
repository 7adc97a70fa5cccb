"""`scale N`: set the target node count within min:max; activates standbys or drains the surplus."""

from typing import Any

from elasticd import steer
from elasticd.commands import Command
from elasticd.coordinator import Coordinator
from elasticd.names import Cause, EventKind, Role
from elasticd.protocol import ErrorCode, arg


def run(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    target = arg(args, "nodes", int)
    force, dry = bool(arg(args, "force", bool, False)), bool(arg(args, "dry_run", bool, False))
    if not 1 <= target <= c.cfg.max_nodes:
        raise steer.refuse(f"scale {target}: must be within 1..{c.cfg.max_nodes} (--nnodes max)",
                           ErrorCode.BAD_ARGUMENT)
    if target < c.cfg.min_nodes and not force:
        raise steer.refuse(f"scale {target} is below --nnodes min {c.cfg.min_nodes}; use --force")
    steer.require_running(c)
    members = c.round.node_ids()
    if target < len(members):
        leaving = members[target:]  # the newest members leave; rank 0 and the coordinator stay
        steer.check_leave(c, leaving, force)
        plan = steer.plan(c, members[:target])
        if dry:
            return {"ok": True, "dry_run": True, "plan": plan}
        c.target = target
        return {**steer.begin(c, "scale", leaving, "standby", "round", f"scale to {target}"), "plan": plan}
    joining = [n.node_id for n in sorted(c.alive(), key=lambda n: n.joined_seq)
               if n.role == Role.standby][: target - len(members)]
    plan = steer.plan(c, members + joining)
    if len(members) + len(joining) < target:
        plan["summary"] += f"; only {len(joining)} standby node(s) available, the rest join when they register"
    if dry:
        return {"ok": True, "dry_run": True, "plan": plan}
    c.target = target
    if joining:
        c.schedule(Cause.membership, f"scale to {target}", c.clock())
    c.emit(EventKind.scale_set, target=target, joining=joining)
    return {"ok": True, "accepted": True, "plan": plan}


COMMANDS = [Command("scale", True, run, "set the target node count N within min:max")]
