"""`kill-worker NODE RANK`: a failure drill; SIGKILL one worker and watch the job recover."""

from elasticd.commands import steering
from elasticd.commands.port import JobPort
from elasticd.commands.verb import Arg, Command, ConsoleAction
from elasticd.wire.names import Cause
from elasticd.wire.protocol import ErrorCode
from elasticd.wire.verb_replies import Plan, Steered
from elasticd.wire.verb_requests import KillWorkerRequest


def plan(c: JobPort, request: KillWorkerRequest) -> Plan:
    node, rank = request.node, request.rank
    rnd = steering.require_running(c)
    entry = rnd.entry(node)
    if entry is None or rank not in entry.ranks:
        raise steering.refuse(f"rank {rank} is not on node '{node}' in round {rnd.round_id}",
                           ErrorCode.NOT_FOUND)
    used, limit = c.restarts[Cause.failure], c.cfg.max_restarts
    if used >= limit and not request.force:
        raise steering.refuse(f"--max-restarts {limit} is used up ({used}); killing a worker would fail the job; "
                           "use --force")
    return Plan(summary=f"rank {rank} on {node} is killed; the job restarts (failure {used + 1} of {limit} allowed)")


def apply(c: JobPort, request: KillWorkerRequest, plan: Plan) -> Steered:
    c.kill_worker(request.node, request.rank)
    return Steered(accepted=True)


COMMANDS = [Command(
    "kill-worker", "failure drill: kill-worker NODE RANK", KillWorkerRequest, order=120, plan=plan, apply=apply,
    args=(Arg("node", "node id"), Arg("rank", "global rank on that node", type=int)),
    console=(ConsoleAction("kill_worker", "K", "Kill a worker (failure drill)", targets="rank", destructive=True),),
)]
