"""`stop`: a graceful end of the job; shim workers checkpoint first, then every daemon exits 0."""

from elasticd.commands import steering
from elasticd.commands.port import JobPort
from elasticd.commands.verb import Command, ConsoleAction
from elasticd.wire.names import After, Role, TransitionKind
from elasticd.wire.verb_replies import Plan, Steered
from elasticd.wire.verb_requests import SteeringRequest


def plan(c: JobPort, request: SteeringRequest) -> Plan:
    steering.require_running(c)
    return Plan(summary=f"job {c.cfg.job_id} stops; every daemon exits")


def apply(c: JobPort, request: SteeringRequest, plan: Plan) -> Steered:
    return steering.begin(c, TransitionKind.stop, [], Role.standby, After.end, "stopped by operator")


COMMANDS = [Command("stop", "graceful end of the job", SteeringRequest, order=130, plan=plan, apply=apply,
                    console=(ConsoleAction("stop", "S", "Stop the job", destructive=True),))]
