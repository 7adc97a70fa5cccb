"""`events`: the bounded job event history, filtered by kind, time or sequence number."""

from typing import Any

from elasticd.commands import Command
from elasticd.coordinator import Coordinator
from elasticd.protocol import arg


def run(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    kinds = arg(args, "kinds", list, [])
    if not all(isinstance(k, str) for k in kinds):
        kinds = []
    events = c.events.query(kinds, float(arg(args, "since_ts", (int, float), 0.0)),
                            arg(args, "since_seq", int, 0), arg(args, "limit", int, 500))
    return {"ok": True, "events": events, "seq": c.events.seq}


COMMANDS = [Command("events", False, run, "event history; filter by kinds, since_ts, since_seq")]
