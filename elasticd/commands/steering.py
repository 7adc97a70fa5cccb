"""Operator steering on the coordinator: interlocks and plans (dry-run) the verbs share."""

from __future__ import annotations

from dataclasses import replace

from elasticd.commands.port import JobPort, RoundView
from elasticd.commands.render import span
from elasticd.wire.names import OUTPUT, After, Cause, JobState, Role, TransitionKind
from elasticd.wire.protocol import ErrorCode, ProtocolError
from elasticd.wire.verb_replies import Plan, Steered


def refuse(reason: str, errno: int = ErrorCode.REFUSED) -> ProtocolError:
    return ProtocolError(errno, reason)


def require_running(c: JobPort) -> RoundView:
    """The current round of a running job, or a refusal."""
    if c.state != JobState.running or c.round is None:
        raise refuse(f"job '{c.cfg.job_id}' is not running (state {c.state})", ErrorCode.NOT_RUNNING)
    return c.round


def require_idle(c: JobPort) -> None:
    """One membership transition at a time: a second would orphan the first's completion."""
    trans = c.transition
    if trans is not None:
        raise refuse(f"a {trans.kind} of {', '.join(trans.leaving) or 'the job'} is in progress (op {trans.op_id}); "
                     f"wait for its {trans.events.complete} event")


def shim_step(c: JobPort) -> int | None:
    """The highest step any rank of this round reported, or None when no worker uses the shim."""
    round_id = c.round.round_id if c.round else None
    steps = [int(m["step"]) for n in c.alive() for m in n.metrics.values()
             if isinstance(m, dict) and m.get("step") is not None and m.get("round") == round_id
             and m.get("source") != OUTPUT]
    return max(steps) if steps else None


def plan(c: JobPort, members_after: list[str]) -> Plan:
    """What a change does to the world: sizes, and which global ranks leave or move."""
    assert c.round is not None
    before = {e.node_id: e.ranks for e in c.round.members}
    after, world = c.rank_map(members_after)
    leaving = sorted(r for n, ranks in before.items() if n not in after for r in ranks)
    moved = {n: [before[n], after[n]] for n in after if n in before and before[n] != after[n]}
    return Plan(world_before=c.round.world_size, world_after=world, nodes_after=members_after,
                ranks_leaving=leaving, ranks_moving=moved,
                summary=f"world {c.round.world_size} → {world}" + (f"; ranks {span(leaving)} leave" if leaving else ""))


def first_spare(c: JobPort, besides: list[str]) -> str | None:
    """The standby that would take a leaving node's place (the first to have joined), if the job has one."""
    return next((n.node_id for n in sorted(c.alive(), key=lambda n: n.joined_seq)
                 if n.role == Role.standby and n.node_id not in besides), None)


def spare_for(c: JobPort, members_after: list[str]) -> list[str]:
    """The members after a node leaves, with the first spare in its place when the job has one."""
    spare = first_spare(c, members_after)
    return members_after + ([spare] if spare else [])


def without_stragglers(c: JobPort, leaving: list[str], planned: Plan) -> Plan:
    """A plan that lets a straggler go says what the job gains: the wait per step its peers no longer have."""
    named = {n: dict(c.stragglers.named[n]) for n in leaving if n in c.stragglers.named}
    if not named:
        return planned
    gain = max(float(f["cost_s_per_step"]) for f in named.values())
    step = max(float(f["step_time_s"]) for f in named.values())
    return replace(planned, stragglers=named, gain_s_per_step=gain,
                   summary=f"{planned.summary}; the straggler {', '.join(named)} goes: about {gain:.3f}s less per "
                           f"{step:.3f}s step (~{gain / step:.0%} faster steps)" if step else planned.summary)


def check_leave(c: JobPort, nodes: list[str], force: bool) -> None:
    assert c.round is not None
    members = c.round.node_ids()
    for node_id in nodes:
        if node_id not in c.nodes:
            raise refuse(f"no node '{node_id}' in job '{c.cfg.job_id}'", ErrorCode.NOT_FOUND)
        if node_id not in members:
            raise refuse(f"node '{node_id}' is not in the current round (role {c.nodes[node_id].role})",
                         ErrorCode.BAD_ARGUMENT)
    if force:
        return
    remaining = len(members) - len(nodes)
    if remaining < c.cfg.min_nodes:
        raise refuse(f"would leave {remaining} node(s), below --nnodes min {c.cfg.min_nodes}; use --force")
    if c.cfg.node_id in nodes:
        raise refuse(f"node '{c.cfg.node_id}' is the coordinator; draining it ends the job; use --force")
    if members[0] in nodes:
        raise refuse(f"node '{members[0]}' holds rank 0; draining it moves rank 0; use --force")


def begin(c: JobPort, kind: TransitionKind, leaving: list[str], final_role: Role, then: After,
          detail: str) -> Steered:
    """Start a graceful transition, one at a time; shim workers stop at one agreed step, plain ones get SIGTERM."""
    require_idle(c)
    op_id = c.begin_transition(kind, leaving, final_role, then, detail, Cause.membership)
    return Steered(accepted=True, op_id=op_id)
