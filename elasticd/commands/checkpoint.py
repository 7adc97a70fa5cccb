"""`checkpoint`: shim workers save at one agreed step boundary; `checkpoint_saved` events follow."""

from typing import Any

from elasticd import steer
from elasticd.commands import Command
from elasticd.coordinator import Coordinator
from elasticd.protocol import ErrorCode, arg, new_id


def run(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    steer.require_running(c)
    step = steer.shim_step(c)
    if step is None:
        raise steer.refuse("no worker of this round reports through trainer_shim yet; a plain script "
                           "checkpoints on its own schedule", ErrorCode.NOT_FOUND)
    at_step = step + steer.STEP_MARGIN
    if arg(args, "dry_run", bool, False):
        return {"ok": True, "dry_run": True, "plan": {"summary": f"every rank saves at step {at_step}"}}
    op_id = new_id()
    for node_id in c.round.node_ids():
        c.send(node_id, "checkpoint_workers", {"request_id": op_id, "at_step": at_step})
    c.emit("checkpoint_requested", op_id=op_id, at_step=at_step)
    return {"ok": True, "accepted": True, "op_id": op_id, "at_step": at_step}


COMMANDS = [Command("checkpoint", True, run, "shim workers save at their next common step boundary")]
