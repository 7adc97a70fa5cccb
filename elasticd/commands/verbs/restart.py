"""`restart`: an operator restart of every worker into a fresh round (cause `operator`)."""

from typing import Any

from elasticd.commands import steering
from elasticd.commands.port import JobPort
from elasticd.commands.verb import Command, ConsoleAction
from elasticd.wire.names import Cause


def plan(c: JobPort, args: dict[str, Any]) -> dict[str, Any]:
    rnd = steering.require_running(c)
    return {"summary": f"every worker restarts; world stays {rnd.world_size}"}


def apply(c: JobPort, args: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    now = c.clock()
    c.resizer.force_restart("operator restart")  # new processes, even for workers that could resize in place
    c.schedule(Cause.operator, "operator restart", now, due=now)
    return {"ok": True, "accepted": True}


COMMANDS = [Command("restart", "operator restart of every worker", order=110, plan=plan, apply=apply,
                    console=(ConsoleAction("restart", "R", "Restart every worker", destructive=True),))]
