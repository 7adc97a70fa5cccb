"""`drain NODE`: a graceful leave; shim workers checkpoint and stop at one step, the node stays as standby."""

from typing import Any

from elasticd.commands import steering
from elasticd.commands.port import JobPort
from elasticd.commands.verb import Arg, Command, ConsoleAction, forced
from elasticd.wire.names import After, Role, TransitionKind
from elasticd.wire.protocol import arg


def plan(c: JobPort, args: dict[str, Any]) -> dict[str, Any]:
    node = arg(args, "node", str)
    rnd = steering.require_running(c)
    steering.check_leave(c, [node], forced(args))
    return steering.without_stragglers(c, [node], steering.plan(c, [n for n in rnd.node_ids() if n != node]))


def apply(c: JobPort, args: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    node = args["node"]
    c.aim_at(max(1, len(steering.require_running(c).node_ids()) - 1))
    return steering.begin(c, TransitionKind.drain, [node], Role.standby, After.round, f"drain of {node}")


COMMANDS = [Command(
    "drain", "graceful leave of a node: drain NODE", order=70, plan=plan, apply=apply,
    args=(Arg("node", "node id"),),
    console=(ConsoleAction("drain", "D", "Drain node(s): graceful leave", targets="nodes", destructive=True),),
)]
