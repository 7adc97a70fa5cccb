"""`scale N`: set the target node count within min:max; activates standbys or drains the surplus."""

from dataclasses import replace

from elasticd.commands import steering
from elasticd.commands.port import JobPort
from elasticd.commands.verb import Arg, Command, ConsoleAction
from elasticd.wire.names import After, Cause, EventKind, Role, TransitionKind
from elasticd.wire.protocol import ErrorCode
from elasticd.wire.verb_replies import Plan, Steered
from elasticd.wire.verb_requests import ScaleRequest


def plan(c: JobPort, request: ScaleRequest) -> Plan:
    target, force = request.nodes, request.force
    if not 1 <= target <= c.cfg.max_nodes:
        raise steering.refuse(f"scale {target}: must be within 1..{c.cfg.max_nodes} (--nnodes max)",
                           ErrorCode.BAD_ARGUMENT)
    if target < c.cfg.min_nodes and not force:
        raise steering.refuse(f"scale {target} is below --nnodes min {c.cfg.min_nodes}; use --force")
    members = steering.require_running(c).node_ids()
    if target < len(members):
        steering.check_leave(c, leaving(c, target), force)
        return steering.plan(c, members[:target])
    joining = [n.node_id for n in sorted(c.alive(), key=lambda n: n.joined_seq)
               if n.role == Role.standby][: target - len(members)]
    result = steering.plan(c, members + joining)
    if len(members) + len(joining) < target:
        return replace(result, summary=f"{result.summary}; only {len(joining)} standby node(s) available, the rest "
                                       "join when they register")
    return result


def leaving(c: JobPort, target: int) -> list[str]:
    return steering.require_running(c).node_ids()[target:]  # the newest members leave; rank 0 and the coordinator stay


def apply(c: JobPort, request: ScaleRequest, plan: Plan) -> Steered:
    target, members = request.nodes, steering.require_running(c).node_ids()
    c.aim_at(target)
    if target < len(members):
        return steering.begin(c, TransitionKind.scale, leaving(c, target), Role.standby, After.round,
                              f"scale to {target}")
    joining = [n for n in plan.nodes_after or [] if n not in members]
    if joining:
        c.schedule(Cause.membership, f"scale to {target}", c.clock())
    c.emit(EventKind.scale_set, target=target, joining=joining)
    return Steered(accepted=True)


COMMANDS = [Command(
    "scale", "set the target node count: scale N", ScaleRequest, order=60, plan=plan, apply=apply,
    args=(Arg("nodes", "target number of nodes", type=int),),
    console=(ConsoleAction("scale_up", "plus", "Scale up: target world +1 node"),
             ConsoleAction("scale_down", "minus", "Scale down: target world -1 node")),
)]
