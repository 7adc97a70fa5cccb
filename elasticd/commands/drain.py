"""`drain NODE`: a graceful leave; shim workers checkpoint and stop at one step, the node stays as standby."""

from typing import Any

from elasticd import steer
from elasticd.commands import Command
from elasticd.coordinator import Coordinator
from elasticd.protocol import arg


def run(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    node = arg(args, "node", str)
    steer.require_running(c)
    steer.check_leave(c, [node], bool(arg(args, "force", bool, False)))
    plan = steer.plan(c, [n for n in c.round.node_ids() if n != node])
    if arg(args, "dry_run", bool, False):
        return {"ok": True, "dry_run": True, "plan": plan}
    c.target = max(1, len(c.round.node_ids()) - 1)
    return {**steer.begin(c, "drain", [node], "standby", "round", f"drain of {node}"), "plan": plan}


COMMANDS = [Command("drain", True, run, "graceful leave of NODE; it stays up as standby")]
