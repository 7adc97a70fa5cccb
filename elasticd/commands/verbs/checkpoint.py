"""`checkpoint`: shim workers save at one agreed step boundary; `checkpoint_saved` events follow."""

from elasticd.commands import steering
from elasticd.commands.port import JobPort
from elasticd.commands.verb import Command, ConsoleAction
from elasticd.wire.names import EventKind, StepRequest
from elasticd.wire.protocol import ErrorCode, new_id
from elasticd.wire.verb_replies import Plan, Steered
from elasticd.wire.verb_requests import SteeringRequest


def plan(c: JobPort, request: SteeringRequest) -> Plan:
    rnd = steering.require_running(c)
    # first_step arrives the moment a shim rank reports in a new round; heartbeat metrics can lag 1 s.
    if "first_step" not in rnd.timeline and steering.shim_step(c) is None:
        raise steering.refuse("no worker of this round reports through trainer_shim yet; a plain script "
                           "checkpoints on its own schedule", ErrorCode.NOT_FOUND)
    return Plan(summary="every rank saves at the next step all of them can reach together (about 0.2 s)")


def apply(c: JobPort, request: SteeringRequest, plan: Plan) -> Steered:
    op_id = new_id()
    c.emit(EventKind.checkpoint_requested, op_id=op_id)
    c.ask_step(op_id, StepRequest.checkpoint)  # `step_agreed` carries the step; `checkpoint_saved` follows
    return Steered(accepted=True, op_id=op_id)


COMMANDS = [Command("checkpoint", "shim workers save at their next common step", SteeringRequest, order=100,
                    plan=plan, apply=apply,
                    console=(ConsoleAction("checkpoint", "c", "Force a checkpoint of every rank"),))]
