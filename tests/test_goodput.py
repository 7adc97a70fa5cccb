"""Goodput: a known history of events, accounted by bucket; resumed by a coordinator that takes over."""

from __future__ import annotations

from typing import Any

import pytest

from elasticd.coordinator.goodput import WINDOW_S, GoodputLedger
from elasticd.wire.names import Cause, EventKind

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`


def history() -> list[dict[str, Any]]:
    """Start-up 5 s; training with a 1 s save; a crash at 20 s (step 150 reached, checkpoint at 100); back at 24 s;
    a join agreed at 40.5 s (its save 0.5 s); back at 43 s with 6 ranks; the job ends at 50 s."""
    e = EventKind
    return [
        {"ts": 2.0, "kind": e.round_started, "round": 1, "world_size": 4, "cause": Cause.start},
        {"ts": 5.0, "kind": e.first_step, "round": 1, "step": 1},
        {"ts": 12.0, "kind": e.checkpoint_saved, "rank": 0, "step": 100, "duration_s": 1.0, "request_id": None},
        {"ts": 20.0, "kind": e.worker_exited, "rank": 1, "exit_code": 1},
        {"ts": 20.5, "kind": e.workers_stopped, "round": 1, "last_step": 150},
        {"ts": 20.6, "kind": e.worker_exited, "rank": 0, "exit_code": -15},  # stopped for the restart
        {"ts": 21.0, "kind": e.round_started, "round": 2, "world_size": 4, "cause": Cause.failure,
         "detail": "worker rank 1 on node b exited with exit code 1"},
        {"ts": 24.0, "kind": e.first_step, "round": 2, "step": 101},
        {"ts": 39.0, "kind": e.node_joined, "node": "c"},
        {"ts": 40.0, "kind": e.reform_started, "op_id": "r1", "detail": "node c joined"},
        {"ts": 41.0, "kind": e.checkpoint_saved, "rank": 0, "step": 260, "duration_s": 0.5, "request_id": "r1"},
        {"ts": 41.2, "kind": e.reform_complete, "op_id": "r1"},
        {"ts": 41.3, "kind": e.round_started, "round": 3, "world_size": 6, "cause": Cause.membership,
         "detail": "node c joined"},
        {"ts": 43.0, "kind": e.first_step, "round": 3, "step": 261},
        {"ts": 50.0, "kind": e.job_end, "state": "succeeded"},
    ]


def test_a_known_history_is_accounted_by_cause_and_the_redone_steps_exactly() -> None:
    ledger = GoodputLedger(0.0)
    for event in history():
        ledger.observe(event)
    life = ledger.report(60.0)["life"]
    redone = 50 * (20 - 5) / (150 - 1)  # steps 101..150 again, at the first round's pace
    assert life["recovery"] == {"start": 5.0, "crash": 4.0, "join": 2.0}
    assert life["checkpoint"] == 1.5 and life["redone"] == pytest.approx(redone, abs=1e-3)
    assert life["training"] == pytest.approx(14 + 16.5 - redone + 7, abs=1e-3)
    assert life["accounted_s"] == pytest.approx(50.0) and life["waiting"] == 0.0
    report = ledger.report(60.0)
    assert report["redone_steps"] == 50
    ranked = (14 * 4 + (16.5 - redone) * 4 + 7 * 6) / (5 * 4 + 15 * 4 + 4 * 4 + 16.5 * 4 + 2.5 * 6 + 7 * 6)
    assert report["goodput"] == pytest.approx(ranked, abs=1e-3)


def test_the_open_stretch_counts_live_and_a_wait_below_the_minimum_is_its_own_bucket() -> None:
    ledger = GoodputLedger(0.0)
    for event in history()[:2]:
        ledger.observe(event)
    assert ledger.report(9.0)["life"]["training"] == 4.0  # trained since 5 s, nothing closed yet
    ledger.observe({"ts": 10.0, "kind": EventKind.node_lost, "node": "b"})
    ledger.observe({"ts": 10.5, "kind": EventKind.waiting, "reason": "waiting for 1 more node(s)"})
    assert ledger.report(12.0)["life"]["waiting"] == 1.5
    ledger.observe({"ts": 30.0, "kind": EventKind.round_started, "round": 2, "world_size": 4,
                    "cause": Cause.failure, "detail": "node b lost"})
    ledger.observe({"ts": 31.0, "kind": EventKind.first_step, "round": 2, "step": 1})
    life = ledger.report(31.0)["life"]
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
    assert second.report(48.0)["life"] == first.report(48.0)["life"]


def test_the_window_holds_only_its_last_hour() -> None:
    ledger = GoodputLedger(0.0)
    for event in history()[:2]:
        ledger.observe(event)
    ledger.observe({"ts": 5.0 + WINDOW_S, "kind": EventKind.worker_exited, "exit_code": 1})
    window = ledger.report(10.0 + WINDOW_S)["window"]
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
