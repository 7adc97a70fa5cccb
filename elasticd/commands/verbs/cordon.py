"""`cordon NODE` keeps a node out of the next rounds; `uncordon NODE` lets it back in."""

from elasticd.commands import steering
from elasticd.commands.port import JobPort
from elasticd.commands.verb import Arg, Command, ConsoleAction
from elasticd.wire.names import After, Cause, EventKind, JobState, NodeStatus, Role, TransitionKind
from elasticd.wire.protocol import ErrorCode
from elasticd.wire.verb_replies import Plan, Steered
from elasticd.wire.verb_requests import NodeRequest


def known_node(c: JobPort, node: str) -> str:
    if node not in c.nodes:
        raise steering.refuse(f"no node '{node}' in job '{c.cfg.job_id}'", ErrorCode.NOT_FOUND)
    return node


def in_round(c: JobPort, node: str) -> bool:
    """A node of the running round leaves it gracefully; any other is cordoned at once."""
    return c.round is not None and c.round.has(node) and c.state == JobState.running


def plan_cordon(c: JobPort, request: NodeRequest) -> Plan:
    node = known_node(c, request.node)
    if not in_round(c, node):
        return Plan(summary=f"node {node} cordoned; the world is unchanged")
    steering.check_leave(c, [node], request.force)
    return steering.without_stragglers(
        c, [node], steering.plan(c, steering.spare_for(
            c, [n for n in steering.require_running(c).node_ids() if n != node])))


def cordon(c: JobPort, request: NodeRequest, plan: Plan) -> Steered:
    node = request.node
    if in_round(c, node):
        return steering.begin(c, TransitionKind.cordon, [node], Role.cordoned, After.round, f"cordon of {node}")
    c.nodes[node].role = Role.cordoned
    c.emit(EventKind.node_role, node, role=Role.cordoned)
    return Steered(dry_run=False)


def plan_uncordon(c: JobPort, request: NodeRequest) -> Plan:
    node = known_node(c, request.node)
    trans = c.transition
    if trans is not None and node in trans.leaving:
        raise steering.refuse(f"a {trans.kind} of {node} is in progress (op {trans.op_id}); uncordon it once "
                           f"its {trans.kind}_complete event arrives")
    if c.nodes[node].role != Role.cordoned:
        raise steering.refuse(f"node '{node}' is not cordoned (role {c.nodes[node].role})", ErrorCode.BAD_ARGUMENT)
    return Plan(summary=f"node {node} may join the next rounds (as standby)")


def uncordon(c: JobPort, request: NodeRequest, plan: Plan) -> Steered:
    node = request.node
    record = c.nodes[node]
    record.role = Role.standby
    c.emit(EventKind.node_role, node, role=Role.standby)
    active = sum(1 for n in c.alive() if n.role == Role.active)
    if record.status == NodeStatus.alive and active < c.target:
        c.schedule(Cause.membership, f"uncordon of {node}", c.clock())
    return Steered(dry_run=False)


NODE = Arg("node", "node id")
COMMANDS = [
    Command("cordon", "keep a node out of the next rounds: cordon NODE", NodeRequest, order=80, plan=plan_cordon,
            apply=cordon, args=(NODE,),
            console=(ConsoleAction("cordon", "o", "Cordon node(s): keep out of next rounds", targets="nodes"),)),
    Command("uncordon", "let a cordoned node back in: uncordon NODE", NodeRequest, order=90, plan=plan_uncordon,
            apply=uncordon, args=(NODE,),
            console=(ConsoleAction("uncordon", "u", "Uncordon node(s)", targets="nodes"),)),
]
