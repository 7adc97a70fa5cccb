"""`status`: the job, its round, and every node with role, state and restarts."""

from elasticd.commands.port import JobPort
from elasticd.commands.verb import Arg, Command
from elasticd.wire.read_replies import StatusReply
from elasticd.wire.verb_requests import StatusRequest


def read(c: JobPort, request: StatusRequest) -> StatusReply:
    return StatusReply(**c.status(c.clock(), request.nodes_offset, request.nodes_limit))


def render(s: StatusReply) -> str:
    restarts = " ".join(f"{k}={v}" for k, v in s.restarts.items())
    lines = [
        f"job {s.job_id}  state {s.state}  round {s.round}  world {s.world_size}  "
        f"nodes {s.min_nodes}:{s.max_nodes} target {s.target}  coordinator {s.coordinator}",
        f"restarts {restarts} (max failures {s.max_restarts})"
        + (f"  goodput {s.goodput:.1%} (elasticd goodput)" if s.goodput is not None else ""),
    ]
    if s.epoch and s.etcd:
        health = "reachable" if s.etcd["ok"] else "UNREACHABLE: membership frozen, training goes on"
        lines.append(f"coordinator elected on etcd, epoch {s.epoch}; etcd {','.join(s.etcd['endpoints'])} "
                     f"({s.etcd['access']}) {health}")
    if s.reason:
        lines.append(f"reason: {s.reason}")
    if s.last_recovery:
        lines.append("last recovery: " + "  ".join(f"{k} {v:.2f}s" for k, v in s.last_recovery.items()))
    if s.refused_keys:
        lines.append(f"refused connections: {s.refused_keys} at this daemon (elasticd events --kind key_refused)")
    if s.spares.get("ready") or s.spares.get("warming"):
        lines.append(f"spares: {s.spares.get('ready', 0)} ready, {s.spares.get('warming', 0)} warming")
    ranks = {e["node_id"]: e["ranks"] for e in s.rank_map}
    lines.append(f"{'NODE':<12} {'HOST':<16} {'ROLE':<9} {'STATUS':<7} {'RANKS':<12} LAST SEEN  HEALTH")
    for n in s.nodes:
        health = ("UNHEALTHY " + "; ".join(n["health"])) if n.get("health") else \
            f"spare {n['spare']}" if n.get("spare") else ""
        lines.append(f"{n['node_id']:<12} {n['host']:<16} {n['role']:<9} {n['status']:<7} "
                     f"{','.join(map(str, ranks.get(n['node_id'], []))) or '-':<12} "
                     f"{n['last_seen_age_s']:>5.1f}s ago {health}".rstrip())
    shown, total = len(s.nodes), s.nodes_total
    if shown < total:
        first = s.nodes_offset
        lines.append(f"nodes {first + 1}-{first + shown} of {total} "
                     f"({', '.join(f'{v} {k}' for k, v in sorted(s.node_counts.items()))}); "
                     "--nodes-offset/--nodes-limit page through them")
    return "\n".join(lines)


COMMANDS = [Command(
    "status", "job state, round, nodes, restarts by cause", StatusRequest, order=10, read=read, reply=StatusReply,
    render=render,
    args=(Arg("nodes_offset", "first node of the page (join order)", type=int, flags=("--nodes-offset",)),
          Arg("nodes_limit", "at most this many nodes (default: all)", type=int, flags=("--nodes-limit",))),
)]
