"""`stacks NODE [RANK]`: every thread's Python stack of a node's live ranks, taken without stopping them."""

from elasticd.commands.port import NodePort
from elasticd.commands.verb import Arg, Command
from elasticd.wire.read_replies import StacksReply
from elasticd.wire.verb_requests import NodeQueryRequest


async def on_node(port: NodePort, request: NodeQueryRequest) -> StacksReply:
    return await port.stacks(request.rank)


def render(result: StacksReply) -> str:
    out = []
    for dump in result.ranks:
        where = f" at {dump['where']}" if dump.get("where") else ""
        out.append(f"── rank {dump.get('rank')} (pid {dump.get('pid')}){where} ──")
        if dump.get("note"):
            out.append(f"({dump['note']})")
        if dump.get("text"):
            out.append(dump["text"])
    return "\n".join(out) or "(no workers)"


COMMANDS = [Command(
    "stacks", "Python stacks of a node's ranks, taken live: stacks NODE [RANK]", NodeQueryRequest, order=36,
    on_node=on_node, reply=StacksReply, render=render,
    args=(Arg("node", "node id"),
          Arg("rank", "global rank (default: every rank of the node)", type=int, optional=True)),
)]
