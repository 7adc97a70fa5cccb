"""Sharded jobs (HSDP) under real daemons: survivors keep their processes, newcomers receive their shards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.harness import Job
from support.resizes import FSDP, changed, digests, finish, first_world, graceful_changes, pids_of


def reference(tmp: Path, steps: int, *args: str) -> dict:
    """The same data on one process, never interrupted: what the resized job must hold at its end. One intra-op
    thread, as elasticd gives its workers (OMP_NUM_THREADS=1, as torchrun does): two threads on a loaded 2-core
    machine wait on each other at every op (127 steps took 62 s beside six busy loops, against 7 s with one)."""
    out = tmp / "ref"
    out.mkdir()
    subprocess.run([sys.executable, str(FSDP), "--steps", str(steps), "--ckpt-dir", str(out / "ckpt"),
                    "--digest-log", str(out / "digests.log"), *args], check=True, timeout=120, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    return torch.load(out / "digests.log.final.pt")


def assert_close(got: dict, want: dict) -> None:
    """Equal but for the order of floating-point reductions (the world size changed)."""
    for part in ("model", "optim"):
        for name, value in want[part].items():
            if isinstance(value, dict):
                for key, t in value.items():
                    torch.testing.assert_close(got[part][name][key], t, rtol=1e-3, atol=1e-5, msg=f"{name}.{key}")
            else:
                torch.testing.assert_close(got[part][name], value, rtol=1e-3, atol=1e-5, msg=name)


# Trains through every kind of change, then (HSDP) replays every step alone: alone ~40 s, beside the suite's other
# torch jobs 130-180 s (the steps grow with the wall time). A hang still fails.
@pytest.mark.timeout(360)
def test_hsdp_job_resizes_in_place_and_a_lost_node_heals_from_its_replica(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=2) as job:
        args = ("--steps", "100000", "--steps-file", str(tmp_path / "stop"), "--ckpt-dir", str(tmp_path / "ckpt"),
                "--digest-log", str(tmp_path / "digests.log"), "--step-time", "0.2")
        heals = []
        a_pids = first_world(job, "a", FSDP, args, 2)

        def change(world: int, act) -> dict:
            done = changed(job, world, act, "a", a_pids)  # a's workers are the same processes
            heals.append((world, done["heal"]))
            return done

        b = graceful_changes(job, FSDP, args, change)
        # b freezes (no socket closes): a's ranks, blocked in a collective with b's, are aborted on their daemon's
        # word once b is declared lost, instead of waiting for the group's 10 s timeout.
        frozen = [b.proc.pid, *pids_of(job, "b")]
        frozen_done = change(2, lambda: [os.kill(pid, signal.SIGSTOP) for pid in frozen])
        assert frozen_done["timeline"]["left"] < 2.0, frozen_done["timeline"]
        print("a frozen node's resize, s since its loss was declared:", frozen_done["timeline"])
        b.kill_with_workers()
        b.wait_exit(10)
        b = job.start("b", FSDP, *args, wait=False)
        change(4, lambda: b.wait_line(r"elasticd \S+: node "))
        lost = change(2, b.kill_with_workers)  # a power loss: a holds the same shards, nothing is read from disk
        assert lost["heal"]["fallback"] is None
        last = finish(job, tmp_path, "a")

    # Only newcomers receive: a join moves b's two shards (the whole state once); a leave moves nothing.
    for world, heal in heals:
        assert heal["fallback"] is None
        assert (heal["received_bytes"] > 0) == (world == 4), heals
    seen = digests(tmp_path / "digests.log")
    assert sorted(seen) == list(range(last)), "a step was lost or trained twice"
    for step, by_round in seen.items():
        assert len(set(by_round.values())) == 1, f"step {step}: the state differed between worlds {by_round}"
    assert not list((tmp_path / "ckpt").glob("sharded-*"))  # nothing was saved, nothing read
    assert_close(torch.load(tmp_path / "digests.log.final.pt"), reference(tmp_path, last))
