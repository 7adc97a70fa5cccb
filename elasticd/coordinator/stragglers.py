"""Stragglers: the node whose ranks make the others wait, named once it does so persistently (not one slow step).

docs/architecture.md, "Stragglers". In synchronous data parallelism every rank's step takes as long as the
slowest's, so step times name nobody; the wait in the gradient allreduce does: the straggler waits least, its
peers wait for it. Shim ranks report that wait (`trainer_shim.step_timing`) with their steps; heartbeats bring
it here, and this compares nodes every 5 s: nothing per step on the mesh.
"""

from __future__ import annotations

import statistics
from typing import Any

from elasticd.coordinator.core import CoordinatorCore
from elasticd.wire.names import STEP_WAIT_METRIC, EventKind, JobState

CHECK_EVERY_S = 10.0  # one look reads every rank's report: ~17 ms at 2,048 nodes of 8 ranks (bench/scale_sim.py)
PERSIST_S = 10.0  # how long a node must hold the others back before it is named (and be fine before it is cleared)
MIN_COST_SHARE = 0.2  # the others wait at least this share of a step for it: less is noise, not a straggler


class Stragglers:
    """Per node: since when it looks slow (or fine again); the nodes named, with what they cost the job."""

    def __init__(self, core: CoordinatorCore) -> None:
        self.core = core
        self.due = 0.0
        self.slow_since: dict[str, float] = {}
        self.fine_since: dict[str, float] = {}
        self.named: dict[str, dict[str, float]] = {}  # node id -> its `straggler` event's figures

    def check(self, now: float) -> None:
        if now < self.due:
            return
        self.due = now + CHECK_EVERY_S
        rnd = self.core.round
        if rnd is None or self.core.state != JobState.running or not (self.named or self.measured(rnd.node_ids())):
            return
        waits, step_times = {}, []
        for node_id in rnd.node_ids():
            node = self.core.nodes.get(node_id)
            ranks, step_time = node_figures(node.metrics if node else {}, rnd.round_id)
            if ranks:  # its rank that waits least: one slow GPU of eight holds everyone back as surely as eight
                waits[node_id] = min(ranks)
            if step_time is not None:
                step_times.append(step_time)
        for node_id in [n for n in self.named if n not in waits]:  # out of the round, or no longer measured
            self.clear(node_id, "no longer in the round's measurements")
        if len(waits) < 2 or not step_times:
            return
        step_time = statistics.median(step_times)
        for node_id, others in medians_of_the_others(waits).items():
            mine = waits[node_id]
            cost = others - mine
            slow = cost >= MIN_COST_SHARE * step_time and mine < others / 2
            self.track(node_id, slow, now, {"wait_s": round(mine, 4), "others_wait_s": round(others, 4),
                                            "cost_s_per_step": round(cost, 4), "step_time_s": round(step_time, 4)})

    def measured(self, node_ids: list[str]) -> bool:
        """Whether the round's ranks report their wait at all: one look at its first node's first report (a job
        whose script does not call `Elastic.watch` costs the coordinator nothing here)."""
        node = self.core.nodes.get(node_ids[0]) if node_ids else None
        report = next(iter(node.metrics.values()), None) if node else None
        return isinstance(report, dict) and STEP_WAIT_METRIC in (report.get("extra") or {})

    def track(self, node_id: str, slow: bool, now: float, figures: dict[str, float]) -> None:
        if slow:
            self.fine_since.pop(node_id, None)
            since = self.slow_since.setdefault(node_id, now)
            if node_id not in self.named and now - since >= PERSIST_S:
                self.named[node_id] = {**figures, "since": since}
                self.core.emit(EventKind.straggler, node_id, **figures, slow_for_s=round(now - since, 1))
            elif node_id in self.named:
                self.named[node_id].update(figures)
            return
        self.slow_since.pop(node_id, None)
        if node_id in self.named and now - self.fine_since.setdefault(node_id, now) >= PERSIST_S:
            self.clear(node_id, "its ranks no longer hold the others back")

    def clear(self, node_id: str, why: str) -> None:
        self.named.pop(node_id, None)
        self.fine_since.pop(node_id, None)
        self.slow_since.pop(node_id, None)
        self.core.emit(EventKind.straggler_cleared, node_id, reason=why)


def node_figures(metrics: dict[str, Any], round_id: int) -> tuple[list[float], float | None]:
    """A node's ranks' waits in the round, and one of their step times (a synchronous job's are alike). Read with
    try, not type checks: this runs over every rank of the job at each look."""
    waits: list[float] = []
    step_time = None
    for report in metrics.values():
        try:
            if report["round"] != round_id:
                continue
            if step_time is None:
                step_time = float(report["step_time"])
            waits.append(float(report["extra"][STEP_WAIT_METRIC]))
        except (KeyError, TypeError, ValueError):  # a report without them (a plain script's, an older shim's)
            continue
    return waits, step_time


def medians_of_the_others(values: dict[str, float]) -> dict[str, float]:
    """For each key (of two or more), the median of the other keys' values: one sort, not one per key."""
    order = sorted(values, key=values.__getitem__)
    ranked = [values[key] for key in order]
    count = len(ranked) - 1  # the others

    def other(pos: int, i: int) -> float:  # the i-th smallest of the values without the one at `pos`
        return ranked[i if i < pos else i + 1]

    return {key: other(pos, count // 2) if count % 2 else (other(pos, count // 2 - 1) + other(pos, count // 2)) / 2
            for pos, key in enumerate(order)}
