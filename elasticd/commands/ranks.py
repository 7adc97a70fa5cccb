"""`ranks`: this round's rank map and the history of earlier rounds."""

from typing import Any

from elasticd.commands import Command
from elasticd.coordinator import Coordinator
from elasticd.protocol import arg


def run(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    limit = arg(args, "history", int, 20)
    rounds = [r.public() for r in c.store.rounds()[-limit:]] if limit > 0 else []
    return {"ok": True, "round": c.round.public() if c.round else None, "history": rounds}


COMMANDS = [Command("ranks", False, run, "rank map of this round, plus history")]
