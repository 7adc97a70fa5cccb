"""`stop`: a graceful end of the job; shim workers checkpoint first, then every daemon exits 0."""

from typing import Any

from elasticd.commands import steering
from elasticd.commands.port import JobPort
from elasticd.commands.verb import Command, ConsoleAction
from elasticd.wire.names import After, Role, TransitionKind


def plan(c: JobPort, args: dict[str, Any]) -> dict[str, Any]:
    steering.require_running(c)
    return {"summary": f"job {c.cfg.job_id} stops; every daemon exits"}


def apply(c: JobPort, args: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    return steering.begin(c, TransitionKind.stop, [], Role.standby, After.end, "stopped by operator")


COMMANDS = [Command("stop", "graceful end of the job", order=130, plan=plan, apply=apply,
                    console=(ConsoleAction("stop", "S", "Stop the job", destructive=True),))]
