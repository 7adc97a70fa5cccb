"""In-place resizes under real daemons: survivors keep their PIDs through every membership change and a crash."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from support.harness import SHIM, Job, cli, wait_for
from support.resizes import ARGS, BATCH, first_world, kept, pids_of, resized

from elasticd.client import Credentials
from elasticd.keys.auth import KeyStore

DATASET = 1000  # examples/train_shim.py


def rank0_steps(folder: Path) -> list[int]:
    """Rank 0's steps in the order its worlds trained them (a world's files carry its round)."""
    files = sorted(folder.glob("rank0-round*.log"), key=lambda p: int(re.search(r"round(\d+)", p.name)[1]))
    return [int(line.split()[0]) for f in files for line in f.read_text().splitlines()]


def epoch_counts(folder: Path) -> dict[int, Counter[int]]:
    counts: dict[int, Counter[int]] = {}
    for path in folder.glob("rank*-round*.log"):
        for line in path.read_text().splitlines():
            for part in line.split()[1:]:
                epoch, _, ids = part.partition(":")
                if ids:
                    counts.setdefault(int(epoch), Counter()).update(int(i) for i in ids.split(","))
    return counts


def test_survivors_keep_their_processes_through_joins_drains_scale_leaves_and_crashes(tmp_path: Path) -> None:
    samples = tmp_path / "samples"
    with Job(tmp_path, nnodes="1:2", nproc=2) as job:
        args = (*ARGS, "--ckpt-dir", str(tmp_path / "ckpt"), "--sample-log", str(samples))
        a_pids = first_world(job, "a", SHIM, args, 2)

        mark = job.seq()
        b = job.start("b", SHIM, *args)  # b joins: a's ranks leave at one step and meet b's (pre-started) ones
        assert kept(job, "a", resized(job, 4, mark)) == (a_pids, a_pids)

        mark = job.seq()
        cli(job, "drain", "b")
        assert kept(job, "a", resized(job, 2, mark)) == (a_pids, a_pids)
        mark = job.seq()
        cli(job, "scale", "2")  # b is back: a's workers are the same processes
        assert kept(job, "a", resized(job, 4, mark)) == (a_pids, a_pids)

        mark = job.seq()
        b.signal(signal.SIGTERM)  # a preemption notice: b's ranks leave at one step, b exits 0
        assert b.wait_exit(30) == 0
        assert kept(job, "a", resized(job, 2, mark)) == (a_pids, a_pids)
        mark = job.seq()
        b = job.start("b", SHIM, *args)
        assert kept(job, "a", resized(job, 4, mark)) == (a_pids, a_pids)

        mark = job.seq()
        victim = min(a_pids)
        os.kill(victim, signal.SIGKILL)  # a crash: the survivors heal from each other, no checkpoint is read
        healed = resized(job, 4, mark)
        assert healed["cause"] == "failure"
        now, kept_now = kept(job, "a", healed)
        assert kept_now == a_pids - {victim} and len(now) == 2 and victim not in now  # one replacement forked
        a_pids = now

        mark = job.seq()
        b.kill_with_workers()  # node b loses power: a's ranks re-form without it
        assert kept(job, "a", resized(job, 2, mark)) == (a_pids, a_pids)
        trained = len(rank0_steps(samples))
        wait_for(lambda: len(rank0_steps(samples)) > trained + 5)  # the last world trains on
        assert not list((tmp_path / "ckpt").glob("ckpt-*.pt"))  # --ckpt-every 0: no newcomer had a file to read

    steps = rank0_steps(samples)
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    # Consecutive, but for at most the step in flight when a peer died (a rank that had finished it).
    assert set(gaps) <= {1, 2} and gaps.count(2) <= 1, steps
    counts = epoch_counts(samples)
    complete = [e for e in counts if e + 1 in counts]  # epochs the job finished
    assert complete, "no epoch finished"
    # A killed rank's share of the step in flight is trained (it was in the allreduce) but never logged when it
    # died after the allreduce and before its log line: the crashed rank's, and node b's two ranks' when it lost
    # power (seen once: 8 samples in one epoch, two ranks' shares), one step's share each at most, nothing else.
    died_mid_step = 3
    unlogged = {epoch: sorted(set(range(DATASET)) - set(counts[epoch])) for epoch in complete}
    assert sum(map(len, unlogged.values())) <= died_mid_step * BATCH // 4, f"samples skipped: {unlogged}"
    for epoch in complete:
        assert set(counts[epoch].values()) == {1}, f"epoch {epoch}: a sample was trained twice"
    digests: dict[int, set[str]] = {}
    for line in (samples / "digests.log").read_text().splitlines():
        round_id, _, _, digest = line.split()
        digests.setdefault(int(round_id), set()).add(digest)
    assert all(len(d) == 1 for d in digests.values()), digests  # every world began bitwise identical


def test_a_resize_whose_rebuild_raises_falls_back_to_a_restart_and_the_job_goes_on(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        args = (*ARGS, "--ckpt-dir", str(tmp_path / "ckpt"), "--fail-resize")
        job.start("a", SHIM, *args)
        first = job.wait_event("round_started", lambda e: e["world_size"] == 1)
        job.wait_event("first_step", since=first["seq"])
        a_pids = pids_of(job, "a")
        mark = job.seq()
        job.start("b", SHIM, *args)
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 2, since=mark)
        assert grown["in_place"]
        failed = job.wait_event("resize_failed", since=mark)
        assert "--fail-resize" in failed["reason"] and failed["round"] == grown["round"]
        restarted = job.wait_event("round_started", lambda e: not e["in_place"], since=failed["seq"])
        assert restarted["world_size"] == 2 and "in-place resize failed" in restarted["detail"]
        job.wait_event("first_step", since=restarted["seq"])  # the job goes on, in new processes
        wait_for(lambda: len(pids_of(job, "a")) == 1 and not pids_of(job, "a") & a_pids)


def test_with_keys_the_job_store_is_reached_through_the_tunnel_and_a_join_resizes_in_place(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys")
    store.init()
    with Job(tmp_path, nnodes="1:2", nproc=1, extra=["--keys", str(tmp_path / "keys")]) as job:
        job.credentials = Credentials.load(str(store.create_client("ops", "operator")),
                                           str(store.node_dir / "node.key"))
        args = (*ARGS, "--ckpt-dir", str(tmp_path / "ckpt"), "--hidden", "65536")
        job.start("a", SHIM, *args)
        first = job.wait_event("round_started", lambda e: e["world_size"] == 1)
        job.wait_event("first_step", since=first["seq"])
        a_pids = set(job.wait_event("workers_started", lambda e: e["node"] == "a")["pids"])
        mark = job.seq()
        job.start("b", SHIM, *args)
        grown = resized(job, 2, mark)
        assert kept(job, "a", grown) == (a_pids, a_pids)
        # b's pre-started worker read the state's size through its node's relay too, and prepared for it
        assert job.wait_event("resize", lambda e: e["round"] == grown["round"], since=mark)["heal"]["prepared_bytes"]


def test_a_joiners_workers_heal_into_memory_they_touched_before_its_round_and_end_equal(tmp_path: Path) -> None:
    """A joining node's pre-started data-parallel worker reads the state's size from the job's store, touches
    memory for what it lacks (SGD's momentum, made at a first step) while the job trains, and its heal puts that
    state there; every world still begins bitwise identical."""
    samples = tmp_path / "samples"
    hidden = 65536
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        args = (*ARGS, "--hidden", str(hidden), "--sample-log", str(samples), "--ckpt-dir", str(tmp_path / "ckpt"))
        a_pids = first_world(job, "a", SHIM, args, 1)
        mark = job.seq()
        job.start("b", SHIM, *args)
        grown = resized(job, 2, mark)
        assert kept(job, "a", grown) == (a_pids, a_pids)
        heal = job.wait_event("resize", lambda e: e["round"] == grown["round"], since=mark)["heal"]
        momentum = (16 * hidden + hidden + hidden + 1) * 4  # one buffer per parameter of the two linears
        assert heal["prepared_bytes"] == momentum and heal["received_bytes"] >= 2 * momentum, heal
        told = subprocess.run([sys.executable, "-m", "elasticd.cli", "events", "--kind", "resize"], env=job.env,
                              capture_output=True, text=True, timeout=30)
        assert told.returncode == 0 and "into memory touched before" in told.stdout, told.stdout + told.stderr
        mark = job.seq()
        cli(job, "drain", "b")  # b stands by with hot spares, which prepare as a joiner's workers do
        assert kept(job, "a", resized(job, 1, mark)) == (a_pids, a_pids)
        mark = job.seq()
        cli(job, "scale", "2")
        back = resized(job, 2, mark)
        assert job.wait_event("resize", lambda e: e["round"] == back["round"], since=mark)["heal"][
            "prepared_bytes"] == momentum
    digests: dict[int, set[str]] = {}
    for line in (samples / "digests.log").read_text().splitlines():
        round_id, _, _, digest = line.split()
        digests.setdefault(int(round_id), set()).add(digest)
    assert len(digests) == 4 and all(len(d) == 1 for d in digests.values()), digests
