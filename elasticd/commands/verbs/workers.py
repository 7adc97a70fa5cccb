"""`workers`: every worker process of every node, as last reported by its daemon."""

from elasticd.commands.port import JobPort
from elasticd.commands.render import GPU_COLUMNS, format_bytes, gpu_cells, has_gpu
from elasticd.commands.verb import Arg, Command
from elasticd.wire.names import NodeStatus
from elasticd.wire.read_replies import WorkersReply
from elasticd.wire.verb_requests import WorkersRequest

COLUMNS = ("NODE", "RANK", "LOCAL", "PID", "STATE", "EXIT", "CPU%", "RSS", "UPTIME")


def read(c: JobPort, request: WorkersRequest) -> WorkersReply:
    only = request.node
    return WorkersReply(nodes={n.node_id: n.workers for n in c.nodes.values()
                               if n.status == NodeStatus.alive and only in ("", n.node_id)})


def render(result: WorkersReply) -> str:
    """One line a worker; the GPU columns only when some daemon reports GPU fields (it has NVML)."""
    gpu = has_gpu([w for workers in result.nodes.values() for w in workers])
    rows = [[*COLUMNS, *(c.upper() for c in GPU_COLUMNS if gpu)]]
    for node, workers in result.nodes.items():
        for w in workers:
            exit_code = "-" if w.get("exit_code") is None else str(w["exit_code"])
            rows.append([node, str(w.get("rank")), str(w.get("local_rank")), str(w.get("pid")), str(w.get("state")),
                         exit_code, f"{float(w.get('cpu_percent') or 0):.0f}", format_bytes(w.get("rss")),
                         f"{float(w.get('uptime_s') or 0):.0f}s", *(gpu_cells(w.get("gpu")) if gpu else [])])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


COMMANDS = [Command("workers", "worker processes of every node", WorkersRequest, order=30, read=read, render=render,
                    reply=WorkersReply,
                    args=(Arg("only_node", "only this node", flags=("--node",), field="node"),))]
