"""`events`: the bounded job event history, filtered by kind, time or sequence number."""

import math
from typing import Any

from elasticd.commands import Command
from elasticd.coordinator import Coordinator
from elasticd.protocol import ErrorCode, ProtocolError, arg


def run(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    kinds = arg(args, "kinds", list, [])
    if not all(isinstance(k, str) for k in kinds):
        kinds = []
    try:
        since_ts = float(arg(args, "since_ts", (int, float), 0.0))
    except OverflowError:  # an integer too large for a float
        since_ts = math.inf
    if not math.isfinite(since_ts):
        raise ProtocolError(ErrorCode.BAD_ARGUMENT, "argument 'since_ts' must be a finite UNIX time")
    events = c.events.query(kinds, since_ts,
                            arg(args, "since_seq", int, 0), arg(args, "limit", int, 500))
    return {"ok": True, "events": events, "seq": c.events.seq}


COMMANDS = [Command("events", False, run, "event history; filter by kinds, since_ts, since_seq")]
