"""Goodput: a known history of events, accounted by bucket; resumed by a coordinator that takes over."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from elasticd.coordinator.alarms import Alarms
from elasticd.coordinator.goodput import WINDOW_S, GoodputLedger
from elasticd.job.config import JobConfig
from elasticd.wire.names import Cause, EventKind

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`


def history() -> list[dict[str, Any]]:
    """Start-up 5 s; training with a 1 s save; a crash at 20 s (step 150 reached, checkpoint at 100); back at 24 s;
    a join agreed at 40.5 s (its save 0.5 s); back at 43 s with 6 ranks; the job ends at 50 s."""
    e = EventKind
    return [
        {"ts": 0.5, "kind": e.node_joined, "node": "a"},
        {"ts": 1.0, "kind": e.node_joined, "node": "b"},
        {"ts": 2.0, "kind": e.round_started, "round": 1, "world_size": 4, "cause": Cause.start,
         "rank_map": {"a": [0, 1], "b": [2, 3]}},
        {"ts": 5.0, "kind": e.first_step, "round": 1, "step": 1},
        {"ts": 12.0, "kind": e.checkpoint_saved, "rank": 0, "step": 100, "duration_s": 1.0, "request_id": None},
        {"ts": 20.0, "kind": e.worker_exited, "rank": 1, "exit_code": 1},
        {"ts": 20.5, "kind": e.workers_stopped, "round": 1, "last_step": 150},
        {"ts": 20.6, "kind": e.worker_exited, "rank": 0, "exit_code": -15},  # stopped for the restart
        {"ts": 21.0, "kind": e.round_started, "round": 2, "world_size": 4, "cause": Cause.failure,
         "detail": "worker rank 1 on node b exited with exit code 1", "rank_map": {"a": [0, 1], "b": [2, 3]}},
        {"ts": 24.0, "kind": e.first_step, "round": 2, "step": 101},
        {"ts": 39.0, "kind": e.node_joined, "node": "c"},
        {"ts": 40.0, "kind": e.reform_started, "op_id": "r1", "detail": "node c joined"},
        {"ts": 41.0, "kind": e.checkpoint_saved, "rank": 0, "step": 260, "duration_s": 0.5, "request_id": "r1"},
        {"ts": 41.2, "kind": e.reform_complete, "op_id": "r1"},
        {"ts": 41.3, "kind": e.round_started, "round": 3, "world_size": 6, "cause": Cause.membership,
         "detail": "node c joined", "rank_map": {"a": [0, 1], "b": [2, 3], "c": [4, 5]}},
        {"ts": 43.0, "kind": e.first_step, "round": 3, "step": 261},
        {"ts": 50.0, "kind": e.job_end, "state": "succeeded"},
    ]


def test_a_known_history_is_accounted_by_cause_and_the_redone_steps_exactly() -> None:
    ledger = GoodputLedger(0.0)
    for event in history():
        ledger.observe(event)
    life = ledger.report(60.0).life
    redone = 50 * (20 - 5) / (150 - 1)  # steps 101..150 again, at the first round's pace
    assert life["recovery"] == {"start": 5.0, "crash": 4.0, "join": 2.0}
    assert life["checkpoint"] == 1.5 and life["redone"] == pytest.approx(redone, abs=1e-3)
    assert life["training"] == pytest.approx(14 + 16.5 - redone + 7, abs=1e-3)
    assert life["accounted_s"] == pytest.approx(50.0) and life["waiting"] == 0.0
    report = ledger.report(60.0)
    assert report.redone_steps == 50
    ranked = (14 * 4 + (16.5 - redone) * 4 + 7 * 6) / (5 * 4 + 15 * 4 + 4 * 4 + 16.5 * 4 + 2.5 * 6 + 7 * 6)
    assert report.goodput == pytest.approx(ranked, abs=1e-3)


def test_the_open_stretch_counts_live_and_a_wait_below_the_minimum_is_its_own_bucket() -> None:
    ledger = GoodputLedger(0.0)
    for event in history()[:4]:
        ledger.observe(event)
    assert ledger.report(9.0).life["training"] == 4.0  # trained since 5 s, nothing closed yet
    ledger.observe({"ts": 10.0, "kind": EventKind.node_lost, "node": "b"})
    ledger.observe({"ts": 10.5, "kind": EventKind.waiting, "reason": "waiting for 1 more node(s)"})
    assert ledger.report(12.0).life["waiting"] == 1.5
    ledger.observe({"ts": 30.0, "kind": EventKind.round_started, "round": 2, "world_size": 4,
                    "cause": Cause.failure, "detail": "node b lost"})
    ledger.observe({"ts": 31.0, "kind": EventKind.first_step, "round": 2, "step": 1})
    life = ledger.report(31.0).life
    assert life["waiting"] == 19.5 and life["recovery"] == {"start": 5.0, "node_loss": 1.5}
    assert life["training"] == 5.0


def test_a_coordinator_that_takes_over_resumes_the_totals_from_the_log() -> None:
    first = GoodputLedger(0.0)
    log = []
    for event in history()[:-1]:  # the job still runs
        first.observe(event)
        log.append(event)
        if event["kind"] == EventKind.first_step:
            log.append({"ts": event["ts"], "kind": EventKind.goodput, **first.state()})
    second = GoodputLedger(45.0)  # elected at 45 s: it knows the job only from the log it adopts
    second.replay(log[-4:])  # the log kept its last events only: the last `goodput` is among them
    assert second.report(48.0).life == first.report(48.0).life


def test_the_window_holds_only_its_last_hour() -> None:
    ledger = GoodputLedger(0.0)
    for event in history()[:4]:
        ledger.observe(event)
    ledger.observe({"ts": 5.0 + WINDOW_S, "kind": EventKind.worker_exited, "exit_code": 1})
    window = ledger.report(10.0 + WINDOW_S).window
    assert window["recovery"] == {"crash": 5.0} and window["training"] == pytest.approx(WINDOW_S - 5.0)


def test_the_console_header_shows_goodput_and_marks_it_below_ninety_percent() -> None:
    from tui.model import JobModel
    from tui.widgets.header import header_text

    model = JobModel("job1", clock=lambda: 100.0)
    model.apply_status({"job_id": "job1", "state": "running", "round": 3, "nodes": [], "goodput": 0.8734})
    text = header_text(model, readonly=False, jobs=["job1"], view="nodes")
    shown = next(span for span in text.spans if text.plain[span.start:span.end] == "87.3%")
    assert "goodput 87.3%" in text.plain and "yellow" in str(shown.style)
    model.apply_status({"job_id": "job1", "state": "running", "round": 3, "nodes": []})  # an older coordinator
    assert "goodput" not in header_text(model, readonly=False, jobs=["job1"], view="nodes").plain


def test_each_node_is_accounted_from_its_join_and_idle_while_it_holds_no_ranks() -> None:
    ledger = GoodputLedger(0.0)
    for event in history():
        ledger.observe(event)
    nodes = {row["node"]: row for row in ledger.report(60.0, nodes=-1).nodes}
    assert nodes["a"]["seconds"] == pytest.approx(49.5) and nodes["b"]["seconds"] == pytest.approx(49.0)
    # c joined at 39 s: idle until the job stopped training for it (40.5 s), then the join's save and recovery
    assert nodes["c"]["seconds"] == pytest.approx(11.0) and nodes["c"]["idle"] == pytest.approx(1.5)
    assert nodes["c"]["lost"] == {"checkpoint": 0.5, "recovery.join": 2.0}
    assert nodes["c"]["goodput"] == pytest.approx(7 / 11, abs=1e-3) and nodes["a"]["idle"] == 0.0
    assert [row["node"] for row in ledger.report(60.0, nodes=1).nodes] == ["c"]  # the lowest first
    spare = GoodputLedger(0.0)
    for event in history()[:4]:
        spare.observe(event)
    spare.observe({"ts": 6.0, "kind": EventKind.node_joined, "node": "d"})  # beyond --nnodes max: no ranks
    spare.observe({"ts": 9.0, "kind": EventKind.node_left, "node": "d"})
    report = spare.report(10.0, nodes=-1)
    assert report.idle_node_s == 3.0 and {r["node"]: r["goodput"] for r in report.nodes}["d"] == 0.0


def test_the_timeline_spreads_each_stretch_over_its_slices_and_loses_no_second() -> None:
    ledger = GoodputLedger(0.0)
    for event in history():
        ledger.observe(event)
    timeline = ledger.report(60.0).timeline
    assert timeline["start"] == 0.0 and timeline["width_s"] == 2.0 and len(timeline["bins"]) == 30
    assert sum(sum(b.values()) for b in timeline["bins"]) == pytest.approx(50.0, abs=0.01)
    assert timeline["bins"][0] == {"recovery.start": 2.0} and timeline["bins"][10] == {"recovery.crash": 2.0}
    assert timeline["bins"][-1] == {}  # after the job's end


def alarms(cfg: JobConfig, ledger: GoodputLedger) -> tuple[Alarms, list[dict[str, Any]]]:
    said: list[dict[str, Any]] = []
    core = SimpleNamespace(cfg=cfg, state="running", emit=lambda kind, **f: said.append({"kind": kind, **f}))
    return Alarms(core, ledger), said  # type: ignore[arg-type]


def test_goodput_under_the_floor_over_its_window_and_a_stale_checkpoint_are_said_once_each() -> None:
    cfg = JobConfig(1, 2, 2, "127.0.0.1", 29400, "job1", "a", ["train.py"], alert_goodput_below=0.8,
                    alert_goodput_window_s=20, alert_checkpoint_age_s=10)
    ledger = GoodputLedger(0.0)
    check, said = alarms(cfg, ledger)
    for event in history()[:-1]:  # the job runs on: no `job_end`
        ledger.observe(event)
        check.check(event["ts"])
    low, stale = said
    assert low["kind"] == EventKind.goodput_low and low["goodput"] == pytest.approx(14 / 20)  # at 20 s: start-up 5 s,
    assert low["window_s"] == 20 and low["floor"] == 0.8  # a 1 s save
    assert stale["kind"] == EventKind.checkpoint_stale and stale["saved_at"] == 12.0 and stale["age_s"] == 27.0
    for t in range(45, 80, 5):  # trained since 43 s: goodput is back over the floor within the window
        check.check(float(t))
    assert said[2:] == [{"kind": EventKind.checkpoint_stale, "age_s": 14.0, "max_age_s": 10, "saved_at": 41.0}]
