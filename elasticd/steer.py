"""Operator steering on the coordinator: plans (dry-run), interlocks, and graceful membership transitions."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from elasticd import step_agreement
from elasticd.coordinator import Coordinator
from elasticd.membership import build_rank_map
from elasticd.protocol import ErrorCode, ProtocolError, new_id

DRAIN_TIMEOUT_S = 30.0


@dataclass
class Transition:
    """A graceful change in flight: shim workers stop at one step, then the job re-forms or ends."""

    op_id: str
    kind: str
    leaving: list[str]
    final_role: str
    then: str  # "round" | "end"
    awaiting: set[str]
    deadline: float
    started: float = field(default_factory=time.time)
    cause: str = "membership"  # the cause of the round that follows
    detail: str = ""


def refuse(reason: str, errno: int = ErrorCode.REFUSED) -> ProtocolError:
    return ProtocolError(errno, reason)


def require_running(c: Coordinator) -> None:
    if c.state != "running" or c.round is None:
        raise refuse(f"job '{c.cfg.job_id}' is not running (state {c.state})", ErrorCode.NOT_RUNNING)


def require_idle(c: Coordinator) -> None:
    """One membership transition at a time: a second would orphan the first's completion."""
    trans = c.transition
    if trans is not None:
        raise refuse(f"a {trans.kind} of {', '.join(trans.leaving) or 'the job'} is in progress (op {trans.op_id}); "
                     "wait for its *_complete event")


def shim_step(c: Coordinator) -> int | None:
    """The highest step any rank of this round reported, or None when no worker uses the shim."""
    steps = [int(m["step"]) for n in c.alive() for m in n.metrics.values()
             if isinstance(m, dict) and m.get("step") is not None and m.get("round") == c.round.round_id]
    return max(steps) if steps else None


def plan(c: Coordinator, members_after: list[str]) -> dict[str, Any]:
    """What a change does to the world: sizes, and which global ranks leave or move."""
    assert c.round is not None
    before = {e.node_id: e.ranks for e in c.round.members}
    entries, world = build_rank_map(members_after, c.nodes)
    after = {e.node_id: e.ranks for e in entries}
    leaving = sorted(r for n, ranks in before.items() if n not in after for r in ranks)
    moved = {n: [before[n], after[n]] for n in after if n in before and before[n] != after[n]}
    return {"world_before": c.round.world_size, "world_after": world, "nodes_after": members_after,
            "ranks_leaving": leaving, "ranks_moving": moved,
            "summary": f"world {c.round.world_size} → {world}" + (f"; ranks {span(leaving)} leave" if leaving else "")}


def span(ranks: list[int]) -> str:
    contiguous = len(ranks) > 1 and ranks[-1] - ranks[0] == len(ranks) - 1
    return f"{ranks[0]}-{ranks[-1]}" if contiguous else ",".join(map(str, ranks))


def check_leave(c: Coordinator, nodes: list[str], force: bool) -> None:
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


def begin(c: Coordinator, kind: str, leaving: list[str], final_role: str, then: str,
          detail: str, cause: str = "membership", detected: float = 0.0) -> dict[str, Any]:
    """Start a graceful transition; shim workers stop at one agreed step, plain ones get SIGTERM."""
    assert c.round is not None
    require_idle(c)
    op_id = new_id()
    for node_id in leaving:
        c.nodes[node_id].role = "draining"
        c.emit("node_role", node_id, role="draining")
    # Every member is awaited until the step agreement says otherwise: with no shim worker anywhere
    # (at_step null) there is nothing to wait for, and the round's SIGTERM stops the plain workers.
    trans = Transition(op_id, kind, leaving, final_role, then, set(c.round.node_ids()),
                       time.time() + DRAIN_TIMEOUT_S, detected or time.time(), cause, detail)
    c.transition = trans
    c.emit(f"{kind}_started", op_id=op_id, nodes=leaving, detail=detail)
    step_agreement.ask(c, op_id, "drain")  # `step_agreed` carries the step every rank stops at
    return {"ok": True, "accepted": True, "op_id": op_id}


def node_drained(c: Coordinator, node_id: str, now: float) -> None:
    trans = c.transition
    if trans is not None and node_id in trans.awaiting:
        trans.awaiting.discard(node_id)
        c.emit(f"{trans.kind}_progress", node_id, op_id=trans.op_id, remaining=sorted(trans.awaiting))
        finish_if_ready(c, now)


def finish_if_ready(c: Coordinator, now: float) -> None:
    trans = c.transition
    if trans is None or (trans.awaiting and now < trans.deadline):
        return
    c.transition = None
    timed_out = bool(trans.awaiting)
    for node_id in trans.leaving:
        c.nodes[node_id].role = trans.final_role
        c.emit("node_role", node_id, role=trans.final_role)
    c.emit(f"{trans.kind}_complete", op_id=trans.op_id, nodes=trans.leaving, timed_out=timed_out,
           duration_s=round(now - trans.started, 3))
    if trans.then == "end":
        c.end("stopped", f"stopped by operator ({trans.op_id})", now)
    else:
        c.schedule(trans.cause, trans.detail, trans.started)
        c.reformed, c.pending_due = True, now


def reform_first(c: Coordinator, cause: str, detail: str, detected: float) -> bool:
    """Before a round that restarts healthy shim workers (a join, scale up, restart), stop them at one step.

    Returns True when it started that graceful stop; the round follows when every rank has saved and stopped.
    A round after a failure or a lost node cannot wait: its workers are failing already.
    """
    if c.reformed or cause not in ("membership", "operator") or c.state != "running" or c.round is None:
        return False
    if any(c.nodes[n].status != "alive" for n in c.round.node_ids()):
        return False
    begin(c, "reform", [], "active", "round", detail, cause, detected)
    return True
