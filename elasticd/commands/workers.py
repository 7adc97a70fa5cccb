"""`workers`: every worker process of every node, as last reported by its daemon."""

from typing import Any

from elasticd.commands import Arg, Command
from elasticd.coordinator import Coordinator
from elasticd.names import NodeStatus
from elasticd.protocol import arg


def read(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    only = arg(args, "node", str, "")
    nodes = {n.node_id: n.workers for n in c.nodes.values() if n.status == NodeStatus.alive and only in ("", n.node_id)}
    return {"ok": True, "nodes": nodes}


COMMANDS = [Command("workers", "worker processes of every node", order=30, read=read,
                    args=(Arg("only_node", "only this node", flags=("--node",), field="node"),))]
