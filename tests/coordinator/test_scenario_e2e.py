"""Issue 2's end-to-end run: a plain torchrun script survives crash, join, leave, rejoin and node loss."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from support.harness import PLAIN, Job, job_processes, wait_gone


def world_sizes(log_text: str) -> list[int]:
    """World sizes in the order rank 0 printed them, consecutive repeats folded."""
    sizes: list[int] = []
    for match in re.finditer(r"\[a:0\] step=\d+ world_size=(\d+)", log_text):
        size = int(match.group(1))
        if not sizes or sizes[-1] != size:
            sizes.append(size)
    return sizes


def test_plain_script_survives_crash_join_leave_rejoin_and_node_loss(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=2, max_restarts=1) as job:
        snapshot = tmp_path / "snapshot.pt"
        args = ("--steps", "1500", "--snapshot", str(snapshot), "--step-time", "0.02")
        a = job.start("a", PLAIN, *args)
        start = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        a.wait_line(r"\[a:0\] step=3 ")

        # 1. SIGKILL one worker: every worker restarts into the same world; one failure restart is charged.
        victim = sorted(job.worker_pids())[0]
        os.kill(victim, signal.SIGKILL)
        crash = job.wait_event("round_started", lambda e: e["cause"] == "failure", since=start["seq"])
        assert crash["world_size"] == 2
        assert job.status()["restarts"]["failure"] == 1
        assert wait_gone(job.worker_pids(0) - job.worker_pids(crash["seq"])) == []
        a.wait_line(r"Resuming training from snapshot")

        # 2. node b joins: the survivors restart into the larger world; no failure is charged.
        b = job.start("b", PLAIN, *args)
        grow = job.wait_event("round_started", lambda e: e["world_size"] == 4, since=crash["seq"])
        assert grow["cause"] == "membership"
        assert grow["rank_map"] == {"a": [0, 1], "b": [2, 3]}  # the survivor keeps rank 0
        a.wait_line(r"\[a:0\] step=\d+ world_size=4")

        # 3. b's elasticd gets SIGTERM: its workers stop, it exits 0, the survivors re-form at once.
        b_pids = job.worker_pids(grow["seq"])
        b.signal(signal.SIGTERM)
        shrink = job.wait_event("round_started", lambda e: e["world_size"] == 2, since=grow["seq"])
        assert shrink["cause"] == "membership"
        assert b.wait_exit(30) == 0
        assert wait_gone(b_pids) == []
        mark = len(a.lines)
        a.wait_line(r"\[a:0\] step=\d+ world_size=2", start=mark)

        # 4. b joins again, then is SIGKILLed with its workers: its closed connection says so, survivors re-form.
        b = job.start("b", PLAIN, *args)
        regrow = job.wait_event("round_started", lambda e: e["world_size"] == 4, since=shrink["seq"])
        mark = len(a.lines)
        a.wait_line(r"\[a:0\] step=\d+ world_size=4", start=mark)
        killed = b.kill_with_workers()
        lost = job.wait_event("node_lost", lambda e: e["node"] == "b", since=regrow["seq"])
        final = job.wait_event("round_started", lambda e: e["world_size"] == 2, since=regrow["seq"])
        assert final["cause"] == "membership"
        assert lost["reason"] == "node b's connection closed"
        assert wait_gone(killed) == []
        job.wait_event("round_complete", lambda e: e["round"] == final["round"], since=final["seq"])
        every_worker = job.worker_pids(0)
        # Only the crash consumed --max-restarts; four membership changes did not.
        restarts = job.status()["restarts"]
        with job.client() as client:
            history = [(r["round_id"], r["cause"], r["detail"]) for r in client.call("ranks", history=50)["history"]]
        # Only the crash is charged. Each of the four membership changes made a round; a loaded 2-core CI box
        # can add one (a starved daemon missing beats and rejoining), which is again no failure.
        assert (restarts["failure"], restarts["operator"], restarts["hang"]) == (1, 0, 0), history
        assert restarts["membership"] >= 4, history

        # The job reaches its last step; every daemon exits 0 and no worker is left.
        assert a.wait_exit(180) == 0, a.output()[-3000:]
        assert "step=1500 " in a.output()
        assert world_sizes(a.output()) == [2, 4, 2, 4, 2]
        a.wait_line(r"job '.*' succeeded")
        assert len(every_worker) == 2 + 2 + 4 + 2 + 4 + 2
        assert wait_gone(every_worker) == []
        assert wait_gone(job_processes(job.job_id)) == []  # nothing of the job is left: no worker, no zygote
