"""`kill-worker NODE RANK`: a failure drill; SIGKILL one worker and watch the job recover."""

from typing import Any

from elasticd.commands import steering
from elasticd.commands.port import JobPort
from elasticd.commands.verb import Arg, Command, ConsoleAction, forced
from elasticd.wire.names import Cause
from elasticd.wire.protocol import ErrorCode, arg


def plan(c: JobPort, args: dict[str, Any]) -> dict[str, Any]:
    node, rank = arg(args, "node", str), arg(args, "rank", int)
    rnd = steering.require_running(c)
    entry = rnd.entry(node)
    if entry is None or rank not in entry.ranks:
        raise steering.refuse(f"rank {rank} is not on node '{node}' in round {rnd.round_id}",
                           ErrorCode.NOT_FOUND)
    used, limit = c.restarts[Cause.failure], c.cfg.max_restarts
    if used >= limit and not forced(args):
        raise steering.refuse(f"--max-restarts {limit} is used up ({used}); killing a worker would fail the job; "
                           "use --force")
    return {"summary": f"rank {rank} on {node} is killed; the job restarts (failure {used + 1} of {limit} allowed)"}


def apply(c: JobPort, args: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    c.kill_worker(args["node"], args["rank"])
    return {"ok": True, "accepted": True}


COMMANDS = [Command(
    "kill-worker", "failure drill: kill-worker NODE RANK", order=120, plan=plan, apply=apply,
    args=(Arg("node", "node id"), Arg("rank", "global rank on that node", type=int)),
    console=(ConsoleAction("kill_worker", "K", "Kill a worker (failure drill)", targets="rank", destructive=True),),
)]
