"""`checkpoint`: shim workers save at one agreed step boundary; `checkpoint_saved` events follow."""

from typing import Any

from elasticd import steer
from elasticd.commands import Command
from elasticd.coordinator import Coordinator
from elasticd.names import EventKind
from elasticd.protocol import ErrorCode, arg, new_id
from elasticd.step_agreement import StepRequest


def run(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    steer.require_running(c)
    # first_step arrives the moment a shim rank reports in a new round; heartbeat metrics can lag 1 s.
    if "first_step" not in c.round.timeline and steer.shim_step(c) is None:
        raise steer.refuse("no worker of this round reports through trainer_shim yet; a plain script "
                           "checkpoints on its own schedule", ErrorCode.NOT_FOUND)
    plan = {"summary": "every rank saves at the next step all of them can reach together (about 0.2 s)"}
    if arg(args, "dry_run", bool, False):
        return {"ok": True, "dry_run": True, "plan": plan}
    op_id = new_id()
    c.emit(EventKind.checkpoint_requested, op_id=op_id)
    c.ask_step(op_id, StepRequest.checkpoint)  # `step_agreed` carries the step; `checkpoint_saved` follows
    return {"ok": True, "accepted": True, "op_id": op_id, "plan": plan}


COMMANDS = [Command("checkpoint", True, run, "shim workers save at their next common step boundary")]
