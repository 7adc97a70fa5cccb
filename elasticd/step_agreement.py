"""One step for every rank: ask each node for its freshest step, then pick one just far enough ahead.

The coordinator's own view of steps arrives with heartbeats (up to 1 s old): too stale to choose a step
that no rank has passed yet. A rank that acts a step later than the others leaves them waiting in a
collective forever, so a drain or a forced checkpoint first asks every member node (a round trip of
milliseconds), then sets at_step = the highest step + enough steps to cover report coalescing and delivery.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from elasticd.coordinator import Coordinator

DELIVERY_BUDGET_S = 0.15  # the shim's 50 ms report coalescing plus request delivery, with room to spare
QUERY_TIMEOUT_S = 1.0


@dataclass
class StepQuery:
    op_id: str
    op: str  # the worker request that follows: "drain" or "checkpoint"
    awaiting: set[str]
    deadline: float
    steps: list[int] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)


def ask(c: Coordinator, op_id: str, op: str) -> None:
    assert c.round is not None
    members = c.round.node_ids()
    c.queries[op_id] = StepQuery(op_id, op, set(members), time.time() + QUERY_TIMEOUT_S)
    for node_id in members:  # the coordinator's own node answers at once, inside this loop
        c.send(node_id, "step_query", {"op_id": op_id})


def answer(c: Coordinator, node_id: str, body: dict[str, Any], now: float) -> None:
    query = c.queries.get(str(body.get("op_id")))
    if query is None or node_id not in query.awaiting:
        return
    query.awaiting.discard(node_id)
    step, step_time = body.get("step"), body.get("step_time")
    if isinstance(step, int) and not isinstance(step, bool):
        query.steps.append(step)
    if isinstance(step_time, int | float) and not isinstance(step_time, bool) and step_time > 0:
        query.step_times.append(float(step_time))
    if not query.awaiting:
        resolve(c, query)


def expire(c: Coordinator, now: float) -> None:
    for query in [q for q in c.queries.values() if now >= q.deadline]:
        resolve(c, query)  # a node that did not answer in time is about to be declared lost anyway


def margin(step_times: list[float]) -> int:
    if not step_times:
        return 2
    return 1 + min(10_000, math.ceil(DELIVERY_BUDGET_S / max(statistics.median(step_times), 1e-4)))


def resolve(c: Coordinator, query: StepQuery) -> None:
    c.queries.pop(query.op_id, None)
    if c.round is None or c.state != "running":
        return
    at_step = max(query.steps) + margin(query.step_times) if query.steps else None
    c.emit("step_agreed", op_id=query.op_id, op=query.op, at_step=at_step)
    trans = c.transition
    if at_step is None and trans is not None and trans.op_id == query.op_id:
        trans.awaiting.clear()  # no shim worker reports steps: nobody will say `drained`
    for node_id in c.round.node_ids():
        c.send(node_id, f"{query.op}_workers", {"request_id": query.op_id, "at_step": at_step})


def local_answer(rank_metrics: dict[int, dict[str, Any]], round_id: int) -> dict[str, Any]:
    """A node's reply: the highest step its shim workers reported in this round, and their step time."""
    current = [m for m in rank_metrics.values() if m.get("round") == round_id and m.get("step") is not None]
    times = [float(m["step_time"]) for m in current if isinstance(m.get("step_time"), int | float)]
    return {"step": max((int(m["step"]) for m in current), default=None),
            "step_time": statistics.median(times) if times else None}
