"""A real 3-node DDP job whose node c loads its data slowly: c, and only c, is named a straggler; the alert command
runs, the console marks c's row, and its drain key, confirmed, takes c out."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.console import SIZE, confirm_dialog, cursor_to, steering_answered, until
from support.harness import SHIM, Job

from elasticd.coordinator.stragglers import PERSIST_S
from tui.app import ElasticApp
from tui.rows import node_rows

pytestmark = pytest.mark.asyncio


async def test_the_node_with_slow_data_loading_is_named_within_30s_and_the_other_never(tmp_path: Path) -> None:
    paged = tmp_path / "paged"
    with Job(tmp_path, nnodes="1:3", nproc=1, extra=["--on-event", f"straggler:cat >> {paged}"]) as job:
        args = ("--steps", "100000", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "0", "--batch", "12",
                "--micro", "4")
        for node in "abc":
            job.start(node, SHIM, *args, *(["--data-delay", "0.1"] if node == "c" else []))
        formed = job.wait_event("round_started", lambda e: e["world_size"] == 3, timeout=120)
        formed = job.wait_event("first_step", since=formed["seq"], timeout=120)
        began = time.monotonic()
        named = job.wait_event("straggler", since=formed["seq"], timeout=30 + PERSIST_S)
        assert time.monotonic() - began <= 30 + PERSIST_S
        assert named["node"] == "c" and named["cost_s_per_step"] >= 0.05, named
        assert set(job.status()["stragglers"]) == {"c"}
        app = ElasticApp({job.job_id: [job.daemons["a"].control]})
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "c" in app.model.stragglers, what="c named in the console")
            rows = {key: " ".join(map(str, cells)) for key, cells in node_rows(app.model, set(), {})}
            assert "SLOW" in rows["c"] and "SLOW" not in rows["a"] + rows["b"]
            await cursor_to(pilot, app, "c")
            await pilot.press("D")  # drain, after the dry run's plan is confirmed
            dialog = await confirm_dialog(pilot)
            assert "the straggler c goes" in str(dialog.query_one("#effect").render())
            await pilot.click("#confirm")
            await until(pilot, lambda: steering_answered(app), what="the drain answered")
        job.wait_event("drain_complete", since=named["seq"], timeout=60)
        assert job.status()["world_size"] == 2
        with job.client() as client:
            events = client.call("events", kinds=["straggler"], limit=0)["events"]
        assert [e["node"] for e in events] == ["c"]  # a and b never
        assert json.loads(paged.read_text())["node"] == "c"  # the operator's command had the event on its stdin
