"""One step for every rank: ask each node for its freshest step, then pick one just far enough ahead.

The coordinator's own view of steps arrives with heartbeats (up to 1 s old): too stale to choose a step
that no rank has passed yet. A rank that acts a step later than the others leaves them waiting in a
collective forever, so a drain or a forced checkpoint first asks every member node (a round trip of
milliseconds), then sets at_step = the highest step + enough steps to cover report coalescing and delivery.
In-place ranks that hear of it late still act together: trainer_shim/step_fence.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from elasticd.wire.member_reports import StepReport
from elasticd.wire.names import MeshOp, StepRequest
from elasticd.wire.protocol import JsonObject

DELIVERY_BUDGET_S = 0.15  # the shim's 50 ms report coalescing plus request delivery, with room to spare
QUERY_TIMEOUT_S = 1.0
SendAll = Callable[[list[str], MeshOp, JsonObject], None]  # (node ids, op, body): one message to many


WORKER_OPS: dict[StepRequest, MeshOp] = {StepRequest.drain: MeshOp.drain_workers,
                                         StepRequest.checkpoint: MeshOp.checkpoint_workers,
                                         StepRequest.resize: MeshOp.resize_workers}


@dataclass
class StepQuery:
    """One step question in flight: what it is for, who has yet to answer, and until when."""

    op_id: str
    request: StepRequest
    awaiting: set[str]
    deadline: float
    steps: list[int] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    in_place: bool = True  # every node answered that all its workers can resize in place
    plain: set[str] = field(default_factory=set)  # nodes that answered with no shim rank: nothing to ask of them

    def at_step(self) -> int | None:
        """The step every rank acts at, or None when no rank reports through the shim."""
        return max(self.steps) + margin(self.step_times) if self.steps else None


class StepAgreement:
    """Open step queries by op id; the coordinator resolves each once it is answered or expires."""

    def __init__(self, send: SendAll) -> None:
        self.send = send
        self.queries: dict[str, StepQuery] = {}

    def ask(self, op_id: str, request: StepRequest, members: list[str], now: float) -> None:
        self.queries[op_id] = StepQuery(op_id, request, set(members), now + QUERY_TIMEOUT_S)
        self.send(members, MeshOp.step_query, {"op_id": op_id})  # our own node answers at once, inside this call

    def answer(self, node_id: str, report: StepReport) -> StepQuery | None:
        """A node's `step_report`; returns the query once every node has answered it."""
        query = self.queries.get(report.op_id)
        if query is None or node_id not in query.awaiting:
            return None
        query.awaiting.discard(node_id)
        query.in_place = query.in_place and report.in_place
        if report.step is None:
            query.plain.add(node_id)
        else:
            query.steps.append(report.step)
        if report.step_time is not None and report.step_time > 0:
            query.step_times.append(report.step_time)
        return self.queries.pop(query.op_id) if not query.awaiting else None

    def expired(self, now: float) -> list[StepQuery]:
        """Queries past their deadline: a node that did not answer in time is about to be declared lost anyway."""
        late = [q for q in self.queries.values() if now >= q.deadline]
        for query in late:
            del self.queries[query.op_id]
        return late


def margin(step_times: list[float]) -> int:
    if not step_times:
        return 2
    return 1 + min(10_000, math.ceil(DELIVERY_BUDGET_S / max(statistics.median(step_times), 1e-4)))
