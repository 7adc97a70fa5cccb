"""`restart`: an operator restart of every worker into a fresh round (cause `operator`)."""

from typing import Any

from elasticd import steer
from elasticd.commands import Command
from elasticd.coordinator import Coordinator
from elasticd.names import Cause
from elasticd.protocol import arg


def run(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    steer.require_running(c)
    plan = {"summary": f"every worker restarts; world stays {c.round.world_size}"}
    if arg(args, "dry_run", bool, False):
        return {"ok": True, "dry_run": True, "plan": plan}
    now = c.clock()
    c.schedule(Cause.operator, "operator restart", now, due=now)
    return {"ok": True, "accepted": True, "plan": plan}


COMMANDS = [Command("restart", True, run, "restart every worker into a new round")]
