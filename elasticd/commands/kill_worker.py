"""`kill-worker NODE RANK`: a failure drill; SIGKILL one worker and watch the job recover."""

from typing import Any

from elasticd import steer
from elasticd.commands import Command
from elasticd.coordinator import Coordinator
from elasticd.names import MeshOp
from elasticd.protocol import ErrorCode, arg


def run(c: Coordinator, args: dict[str, Any]) -> dict[str, Any]:
    node, rank = arg(args, "node", str), arg(args, "rank", int)
    steer.require_running(c)
    entry = c.round.entry(node)
    if entry is None or rank not in entry.ranks:
        raise steer.refuse(f"rank {rank} is not on node '{node}' in round {c.round.round_id}",
                           ErrorCode.NOT_FOUND)
    used, limit = c.restarts["failure"], c.cfg.max_restarts
    if used >= limit and not arg(args, "force", bool, False):
        raise steer.refuse(f"--max-restarts {limit} is used up ({used}); killing a worker would fail the job; "
                           "use --force")
    plan = {"summary": f"rank {rank} on {node} is killed; the job restarts (failure {used + 1} of {limit} allowed)"}
    if arg(args, "dry_run", bool, False):
        return {"ok": True, "dry_run": True, "plan": plan}
    c.send(node, MeshOp.kill_worker, {"rank": rank})
    return {"ok": True, "accepted": True, "plan": plan}


COMMANDS = [Command("kill-worker", True, run, "SIGKILL one worker (failure drill)")]
