"""`drain NODE`: a graceful leave; shim workers checkpoint and stop at one step, the node stays as standby; a spare
(a standby already there) takes its place, else the job aims at one node fewer."""

from elasticd.commands import steering
from elasticd.commands.port import JobPort
from elasticd.commands.verb import Arg, Command, ConsoleAction
from elasticd.wire.names import After, Role, TransitionKind
from elasticd.wire.verb_replies import Plan, Steered
from elasticd.wire.verb_requests import NodeRequest


def plan(c: JobPort, request: NodeRequest) -> Plan:
    rnd = steering.require_running(c)
    steering.check_leave(c, [request.node], request.force)
    return steering.without_stragglers(c, [request.node],
                                       steering.plan(c, steering.spare_for(
                                           c, [n for n in rnd.node_ids() if n != request.node])))


def apply(c: JobPort, request: NodeRequest, plan: Plan) -> Steered:
    members = steering.require_running(c).node_ids()
    if steering.first_spare(c, members) is None:  # else a spare takes the node's place: the world stays
        c.aim_at(max(1, len(members) - 1))
    return steering.begin(c, TransitionKind.drain, [request.node], Role.standby, After.round,
                          f"drain of {request.node}")


COMMANDS = [Command(
    "drain", "graceful leave of a node: drain NODE", NodeRequest, order=70, plan=plan, apply=apply,
    args=(Arg("node", "node id"),),
    console=(ConsoleAction("drain", "D", "Drain node(s): graceful leave", targets="nodes", destructive=True),),
)]
