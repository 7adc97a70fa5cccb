"""--metrics-from-output: an unmodified script's printed step and loss become its rank's metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.console import SIZE, until
from support.harness import PLAIN, Job, cli, wait_for

from elasticd.member.output_metrics import compile_pattern, parse_line
from tui.app import ElasticApp

PLAIN_LINE = r"step=(?P<step>\d+) world_size=\d+ loss=(?P<loss>[-\d.e]+)"  # what examples/train_plain.py prints


def test_a_line_states_step_loss_and_epoch_or_nothing() -> None:
    pattern = compile_pattern(r"epoch (?P<epoch>\d+) step (?P<step>\d+).*loss[=:] ?(?P<loss>\S+)")
    assert parse_line(pattern, "epoch 2 step 40 | loss: 0.25") == {"epoch": 2, "step": 40, "loss": 0.25}
    assert parse_line(pattern, "epoch 2 step 40 | loss: nan?") is None  # a garbled number is no report
    assert parse_line(pattern, "saving checkpoint") is None
    assert parse_line(compile_pattern(r"loss (?P<loss>\S+)"), "loss 1e-3") == {"loss": 0.001}


def test_a_plain_script_shows_step_and_loss_and_is_not_hung_while_its_step_lines_flow(tmp_path: Path) -> None:
    # Its step lines are its heartbeat (a hang when they stop: tests/hosts/test_diagnosis_hosts.py); rank 1 prints
    # none, and a rank that never printed a step line is never judged.
    with Job(tmp_path, nnodes="1:1", nproc=2,
             extra=["--metrics-from-output", PLAIN_LINE, "--hang-timeout", "5"]) as job:
        a = job.start("a", PLAIN, "--steps", "100000", "--snapshot", str(tmp_path / "snap.pt"), "--step-time", "0.6")
        a.wait_line(r"\[a:0\] step=4 ")

        def rank0() -> dict[str, Any]:  # train_plain.py prints on rank 0 only
            return next((r for r in cli(job, "metrics")["ranks"] if r["rank"] == 0), {})
        wait_for(lambda: (rank0().get("step") or 0) >= 4)  # the printed step rides the next heartbeat
        assert isinstance(rank0()["loss"], float)
        with job.client() as client:
            kinds = {e["kind"] for e in client.call("events", limit=0)["events"]}
        assert "first_step" in kinds and "worker_hung" not in kinds
        assert job.status()["restarts"] == {"failure": 0, "membership": 0, "operator": 0, "hang": 0}


@pytest.mark.asyncio
async def test_the_console_shows_a_plain_scripts_printed_step_and_loss(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:1", nproc=1, extra=["--metrics-from-output", PLAIN_LINE]) as job:
        a = job.start("a", PLAIN, "--steps", "100000", "--snapshot", str(tmp_path / "snap.pt"), "--step-time", "0.1")
        a.wait_line(r"\[a:0\] step=2 ")
        app = ElasticApp({job.job_id: [a.control]})
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: (r := app.model.rank_metrics.get(0)) is not None and (r.step or 0) > 2
                        and isinstance(r.loss, float), what="rank 0's step and loss in the console")
            await pilot.press("colon", *"loss", "enter")
            await until(pilot, lambda: app.view == "loss", what="the loss view")
