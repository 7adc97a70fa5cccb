"""`restart`: an operator restart of every worker into a fresh round (cause `operator`)."""

from elasticd.commands import steering
from elasticd.commands.port import JobPort
from elasticd.commands.verb import Command, ConsoleAction
from elasticd.wire.names import Cause
from elasticd.wire.verb_replies import Plan, Steered
from elasticd.wire.verb_requests import SteeringRequest


def plan(c: JobPort, request: SteeringRequest) -> Plan:
    rnd = steering.require_running(c)
    return Plan(summary=f"every worker restarts; world stays {rnd.world_size}")


def apply(c: JobPort, request: SteeringRequest, plan: Plan) -> Steered:
    now = c.clock()
    c.resizer.force_restart("operator restart")  # new processes, even for workers that could resize in place
    c.schedule(Cause.operator, "operator restart", now, due=now)
    return Steered(accepted=True)


COMMANDS = [Command("restart", "operator restart of every worker", SteeringRequest, order=110, plan=plan, apply=apply,
                    console=(ConsoleAction("restart", "R", "Restart every worker", destructive=True),))]
