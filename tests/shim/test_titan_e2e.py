"""A torchtitan-shaped job (examples/train_titan.py: meta init, per-layer FSDP2, a named HSDP mesh, AdamW and a
warm-up schedule, 117 DTensors) through every kind of change under real daemons."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.harness import ROOT, Job
from support.resizes import changed, digests, finish, first_world, graceful_changes

TITAN = ROOT / "examples" / "train_titan.py"


# Trains through every kind of change: alone ~30 s, beside the suite's other torch jobs up to 135 s. A hang still fails.
@pytest.mark.timeout(360)
def test_a_torchtitan_shaped_job_keeps_its_processes_and_every_step_through_each_kind_of_change(
        tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=2) as job:
        args = ("--steps", "100000", "--steps-file", str(tmp_path / "stop"), "--ckpt-dir", str(tmp_path / "ckpt"),
                "--digest-log", str(tmp_path / "digests.log"), "--step-time", "0.1", "--ckpt-every", "0")
        a_pids = first_world(job, "a", TITAN, args, 2)
        stalls = []

        def change(world: int, act) -> None:
            done = changed(job, world, act, "a", a_pids)  # a's workers kept; the stall's parts add up to it
            assert done["heal"]["fallback"] is None, done  # every shard had a live replica: nothing read
            stalls.append((done["detail"], done["parts"]))

        b = graceful_changes(job, TITAN, args, change)
        change(2, b.kill_with_workers)
        b = job.start("b", TITAN, *args, wait=False)
        change(4, lambda: b.wait_line(r"elasticd \S+: node "))
        last = finish(job, tmp_path, "a")
    print("where each stall went (s):", *stalls, sep="\n  ")
    # The kept ranks freed their old world's model, measured: the parts are the last rank's to join, a kept one's
    # in a change that adds nobody.
    assert any(parts["collect"] > 0 for _, parts in stalls), stalls
    seen = digests(tmp_path / "digests.log")
    assert sorted(seen) == list(range(last)), "a step was lost or trained twice"
    for step, by_round in seen.items():
        assert len(set(by_round.values())) == 1, f"step {step}: the state differed between worlds {by_round}"
