"""A sharded job with no replica (FSDP2) under real daemons: shards move in memory, a lost shard falls back."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from support.harness import Job, cli, wait_for
from support.resizes import FSDP, changed, digests, finish, first_world, pids_of, resized

from trainer_shim.sharded import list_sharded


def test_fsdp_job_reshards_in_memory_and_falls_back_to_its_checkpoint_when_a_shard_is_lost(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=2) as job:
        args = ("--steps", "100000", "--steps-file", str(tmp_path / "stop"), "--ckpt-dir", str(tmp_path / "ckpt"),
                "--digest-log", str(tmp_path / "digests.log"), "--step-time", "0.2", "--mesh", "fsdp",
                "--ckpt-every", "10")
        job.start("a", FSDP, *args)
        b = job.start("b", FSDP, *args)
        job.wait_event("first_step", since=job.wait_event("round_started", lambda e: e["world_size"] == 4)["seq"])
        a_pids = pids_of(job, "a")
        # b's shards move to a's ranks before b's leave: no checkpoint is read
        assert changed(job, 2, lambda: cli(job, "drain", "b"), "a", a_pids)["heal"]["fallback"] is None
        mark = job.seq()
        cli(job, "scale", "2")
        rnd = resized(job, 4, mark)
        wait_for(lambda: bool(list_sharded(str(tmp_path / "ckpt"))))  # a complete one
        mark = job.seq()
        b.kill_with_workers()  # b's shards had no replica: the newest checkpoint, resharded to the two ranks left
        rnd = resized(job, 2, mark)
        heal = job.wait_event("resize", lambda e: e["round"] == rnd["round"], since=mark)["heal"]
        reason = heal["fallback"] or ""
        assert "held by no live rank" in reason and "loaded checkpoint step" in reason, heal
        with job.client() as client:  # every round has started: the next thing is the job's end
            worlds = {e["round"]: e["world_size"] for e in
                      client.call("events", kinds=["round_started"], limit=0)["events"]}
        finish(job, tmp_path, "a")
    # A round's first state is restored (healed, or loaded after the fallback): bit for bit the state some earlier
    # round logged at that step. A step trained from the same state in a world of the same size gives the same state;
    # the history before it may differ: the kill can land before the newest save is whole, and the job goes back to
    # a save from before the drain, so steps trained at 4 are trained again at 2 (FSDP's reduce-scatter sums in
    # another order in another size) and the steps after them start from another state.
    seen = digests(tmp_path / "digests.log")
    first = {r: min(step for step, by_round in seen.items() if r in by_round) for r in worlds if
             any(r in by_round for by_round in seen.values())}
    for step, by_round in seen.items():
        before = seen.get(step - 1, {})
        for r, digest in by_round.items():
            if first[r] == step:
                earlier = {d for q, d in by_round.items() if q < r}
                assert earlier <= {digest}, f"step {step}: round {r} restored another state {by_round}"
                continue
            twins = {d for q, d in by_round.items() if q != r and first[q] != step and worlds[q] == worlds[r]
                     and before.get(q) == before[r]}
            assert twins <= {digest}, f"step {step}: the same state trained in a world of {worlds[r]} gave " \
                                      f"another one {by_round} (the step before: {before})"


def test_a_resize_at_a_checkpoint_boundary_saves_in_the_old_world_then_resizes(tmp_path: Path) -> None:
    """The script saves after every step, so every resize meets a save at its boundary: the survivors save with
    the ranks of the world that trained that step, then resize, rather than save in a world whose newcomers
    skip that boundary's save (a hang until the collectives' timeout, then a restart). A crash meets one too:
    the survivors train the lost step again in the new world before `run_step` returns, as the newcomer does."""
    with Job(tmp_path, nnodes="1:2", nproc=2) as job:
        args = ("--steps", "100000", "--steps-file", str(tmp_path / "stop"), "--ckpt-dir", str(tmp_path / "ckpt"),
                "--digest-log", str(tmp_path / "digests.log"), "--step-time", "0.3", "--mesh", "fsdp",
                "--ckpt-every", "1")
        a_pids = first_world(job, "a", FSDP, args, 2)
        changed(job, 4, lambda: job.start("b", FSDP, *args), "a", a_pids)  # the join CI saw hang: agreed on a save
        victim = max(a_pids)  # its shard has no replica: the heal reads the newest save
        job.wait_event("checkpoint_saved", since=job.seq())  # the crash comes after a save: in the pause or a step
        crashed = changed(job, 4, lambda: os.kill(victim, signal.SIGKILL), "a", a_pids - {victim})
        assert "loaded checkpoint step" in crashed["heal"]["fallback"], crashed
        finish(job, tmp_path, "a", extra=3)
    seen = digests(tmp_path / "digests.log")
    assert all(len(set(by_round.values())) == 1 for by_round in seen.values())
