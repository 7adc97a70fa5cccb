"""Stragglers: the node whose ranks wait least in the gradient allreduce, persistently, is named; nobody else."""

from __future__ import annotations

import random
import statistics
from types import SimpleNamespace
from typing import Any

import pytest

from elasticd.coordinator.stragglers import PERSIST_S, Stragglers, medians_of_the_others
from elasticd.wire.names import STEP_WAIT_METRIC, EventKind, JobState

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`


class Job:
    """The coordinator as the check reads it: a round of three nodes whose heartbeats carry each rank's wait."""

    def __init__(self, waits: dict[str, float], step_time: float = 0.15) -> None:
        self.state, self.events = JobState.running, []
        self.round = SimpleNamespace(round_id=2, node_ids=lambda: list(self.waits))
        self.waits, self.step_time, self.measured = waits, step_time, True

    @property
    def nodes(self) -> dict[str, Any]:
        return {n: SimpleNamespace(metrics={"0": {"round": 2, "step_time": self.step_time,
                                                  "extra": {STEP_WAIT_METRIC: w} if self.measured else {}}})
                for n, w in self.waits.items()}

    def emit(self, kind: str, node: str = "", **fields: Any) -> dict[str, Any]:
        self.events.append({"kind": kind, "node": node, **fields})
        return self.events[-1]


def run(check: Stragglers, start: float, seconds: float) -> None:
    for t in range(int(seconds) + 1):
        check.check(start + t)


def test_the_node_that_makes_the_others_wait_is_named_after_it_persists_and_cleared_when_it_stops() -> None:
    job = Job({"a": 0.12, "b": 0.11, "c": 0.004})
    check = Stragglers(job)  # type: ignore[arg-type]
    run(check, 0, PERSIST_S - 1)
    assert job.events == []  # slow for less than PERSIST_S: not yet
    run(check, PERSIST_S, 2)
    named, = job.events
    assert named["kind"] == EventKind.straggler and named["node"] == "c"
    assert named["cost_s_per_step"] == pytest.approx(0.111, abs=1e-3) and named["step_time_s"] == 0.15
    assert set(check.named) == {"c"}
    job.waits = {"a": 0.01, "b": 0.012, "c": 0.011}  # c's data loading is fast again
    run(check, 100, PERSIST_S + 1)
    assert [e["kind"] for e in job.events] == [EventKind.straggler, EventKind.straggler_cleared] and not check.named


def test_a_balanced_job_with_noisy_waits_names_nobody() -> None:
    job = Job({"a": 0.02, "b": 0.035, "c": 0.004})  # c waits least, but the others wait 3 % of a step for it
    check = Stragglers(job)  # type: ignore[arg-type]
    run(check, 0, 300)
    assert job.events == [] and check.named == {}


def test_ranks_that_do_not_measure_their_wait_name_nobody() -> None:
    job = Job({"a": 0.12, "b": 0.11, "c": 0.004})
    job.measured = False  # a shim script without `elastic.watch(ddp)`, or a plain one
    check = Stragglers(job)  # type: ignore[arg-type]
    run(check, 0, 60)
    assert job.events == []


@pytest.mark.quick
def test_the_console_marks_a_straggler_and_a_drain_plan_says_what_the_job_gains() -> None:
    from tui.model import JobModel
    from tui.rows import node_row

    model = JobModel("job1", clock=lambda: 100.0)
    named = {"c": {"wait_s": 0.004, "others_wait_s": 0.12, "cost_s_per_step": 0.116, "step_time_s": 0.15}}
    model.apply_status({"job_id": "job1", "state": "running", "round": 2, "stragglers": named,
                        "nodes": [{"node_id": n, "host": "h", "role": "active", "status": "alive"} for n in "abc"]})
    cells = {n: node_row(model, model.nodes[n], False, {}) for n in "abc"}
    assert "SLOW" in cells["c"][3].plain and "SLOW" not in cells["a"][3].plain + cells["b"][3].plain

    from elasticd.commands.steering import without_stragglers
    from elasticd.wire.verb_replies import Plan
    port = SimpleNamespace(stragglers=SimpleNamespace(named=named))
    plan = without_stragglers(port, ["c"], Plan(summary="world 6 → 4"))  # type: ignore[arg-type]
    assert plan.gain_s_per_step == 0.116 and "the straggler c goes: about 0.116s less per 0.150s step" in plan.summary
    assert without_stragglers(port, ["a"], Plan(summary="world 6 → 4")) == Plan(summary="world 6 → 4")  # type: ignore[arg-type]


def test_each_nodes_others_median_is_the_median_without_it() -> None:
    rng = random.Random(7)
    for size in (2, 3, 4, 5, 10, 33):
        values = {f"n{i}": rng.choice([0.0, 0.01, 0.05, rng.random()]) for i in range(size)}
        assert medians_of_the_others(values) == {
            key: statistics.median([v for k, v in values.items() if k != key]) for key in values}
