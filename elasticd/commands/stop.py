"""`stop`: a graceful end of the job; shim workers checkpoint first, then every daemon exits 0."""

from typing import Any

from elasticd import steer
from elasticd.commands import Command
from elasticd.coordinator import Coordinator
from elasticd.protocol import arg


def run(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    steer.require_running(c)
    plan = {"summary": f"job {c.cfg.job_id} stops; every daemon exits"}
    if arg(args, "dry_run", bool, False):
        return {"ok": True, "dry_run": True, "plan": plan}
    return {**steer.begin(c, "stop", [], "standby", "end", "operator stop"), "plan": plan}


COMMANDS = [Command("stop", True, run, "graceful end of the job")]
