"""A real DDP job whose node c loads its data slowly: c, and only c, is named a straggler."""

from __future__ import annotations

import time
from pathlib import Path

from harness import SHIM, Job

from elasticd.coordinator.stragglers import PERSIST_S


def test_the_node_with_slow_data_loading_is_named_within_30s_and_the_other_never(tmp_path: Path) -> None:
    job = Job(tmp_path, nnodes="1:2", nproc=1)
    args = ("--steps", "100000", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "0", "--batch", "12",
            "--micro", "4")
    try:
        for node in "ac":
            job.start(node, SHIM, *args, *(["--data-delay", "0.1"] if node == "c" else []))
        formed = job.wait_event("first_step", timeout=120)
        began = time.monotonic()
        named = job.wait_event("straggler", since=formed["seq"], timeout=30 + PERSIST_S)
        assert time.monotonic() - began <= 30 + PERSIST_S
        assert named["node"] == "c" and named["cost_s_per_step"] >= 0.05, named
        status = job.status()
        assert set(status["stragglers"]) == {"c"}
        with job.client() as client:
            plan = client.call("drain", node="c", dry_run=True)["plan"]
            events = client.call("events", kinds=["straggler"], limit=0)["events"]
        assert plan["stragglers"].keys() == {"c"} and "the straggler c goes" in plan["summary"]
        assert [e["node"] for e in events] == ["c"]  # a never
    finally:
        job.close()
