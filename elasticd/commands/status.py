"""`status`: the job, its round, and every node with role, state and restarts."""

from typing import Any

from elasticd.commands import Command
from elasticd.coordinator import Coordinator


def run(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, **c.status(c.clock())}


COMMANDS = [Command("status", False, run, "job state, round, world size, nodes, restarts by cause")]
