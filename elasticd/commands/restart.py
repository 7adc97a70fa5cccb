"""`restart`: an operator restart of every worker into a fresh round (cause `operator`)."""

import time
from typing import Any

from elasticd import steer
from elasticd.commands import Command, ConsoleAction
from elasticd.coordinator import Coordinator


def plan(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    steer.require_running(c)
    return {"summary": f"every worker restarts; world stays {c.round.world_size}"}


def apply(c: Coordinator, args: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    c.schedule("operator", "operator restart", time.time())
    c.pending_due = time.time()
    return {"ok": True, "accepted": True}


COMMANDS = [Command("restart", "operator restart of every worker", order=110, plan=plan, apply=apply,
                    console=(ConsoleAction("restart", "R", "Restart every worker", destructive=True),))]
