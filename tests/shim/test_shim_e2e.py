"""trainer_shim under real daemons: live metrics, forced checkpoints, zero-loss resizes, exact samples, hangs."""

from __future__ import annotations

import os
import re
import signal
from collections import Counter
from pathlib import Path

from support.harness import SHIM, SHIM_TICKER, Job, cli, sample_lines, wait_for

from elasticd.client import Client

DATASET = 1000  # examples/train_shim.py


def epoch_counts(folder: Path, epoch: int) -> Counter[int]:
    counts: Counter[int] = Counter()
    for lines in sample_lines(folder).values():
        for _, micro_batches in lines:
            for part in micro_batches.split():
                e, _, ids = part.partition(":")
                if int(e) == epoch and ids:
                    counts.update(int(i) for i in ids.split(","))
    return counts


def reached_epoch(folder: Path, epoch: int) -> bool:
    return any(part.startswith(f"{epoch}:") for lines in sample_lines(folder).values()
               for _, ids in lines for part in ids.split())


def test_shim_job_metrics_checkpoint_zero_loss_resizes_exact_samples_and_hang(tmp_path: Path) -> None:
    samples, ckpts = tmp_path / "samples", tmp_path / "ckpt"
    with Job(tmp_path, nnodes="1:2", nproc=2, extra=["--hang-timeout", "5"]) as job:
        args = ("--steps", "100000", "--ckpt-dir", str(ckpts), "--ckpt-every", "0", "--step-time", "0.1",
                "--batch", "16", "--micro", "8", "--sample-log", str(samples))
        job.start("a", SHIM, *args)
        first = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        job.wait_event("first_step", since=first["seq"])
        job.start("b", SHIM, *args)
        # b's join first stops a's healthy workers at one agreed step: the world grows and nothing is lost.
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 4)
        reform = job.wait_event("reform_complete", since=first["seq"])
        assert not reform["timed_out"]
        job.wait_event("first_step", since=grown["seq"])

        # Metrics: step, loss and throughput for every rank, moving.
        # A rank shows from its hello on, with no step until its first report: wait for all four to step.
        wait_for(lambda: sum(r["step"] is not None for r in cli(job, "metrics")["ranks"]) == 4)
        before = max(r["step"] for r in cli(job, "metrics")["ranks"])
        wait_for(lambda: min(r["step"] for r in cli(job, "metrics")["ranks"]) > before)
        after = cli(job, "metrics")["ranks"]
        assert sorted(r["rank"] for r in after) == [0, 1, 2, 3]
        assert all(isinstance(r["loss"], float) and r["throughput"] for r in after)
        # The same steps stream on each daemon's PUB as `st.<node>`, a few times a second.
        with Client(job.daemons["b"].control) as client:
            telemetry = client.subscribe(job.daemons["b"].pub)
            steps = next(e for e in telemetry if e.type == "st")
        assert steps.node == "b" and sorted(r["rank"] for r in steps.body["ranks"]) == [2, 3]
        assert all(isinstance(r["step"], int) for r in steps.body["ranks"])

        # drain b: every rank stops at one step with a checkpoint; the smaller world resumes right there.
        mark = job.seq()
        cli(job, "drain", "b")
        shrunk = job.wait_event("round_started", lambda e: e["world_size"] == 2, since=mark)
        assert not job.wait_event("drain_complete", since=mark)["timed_out"]
        job.wait_event("first_step", since=shrunk["seq"])
        # scale 2: b comes back; the survivors stop at one step again before the world grows.
        mark = job.seq()
        cli(job, "scale", "2")
        regrown = job.wait_event("round_started", lambda e: e["world_size"] == 4, since=mark)
        job.wait_event("first_step", since=regrown["seq"])
        steps = [step for step, _ in sample_lines(samples)[0]]
        assert steps == list(range(1, len(steps) + 1)), "a step was lost or repeated across the resizes"
        assert job.status()["restarts"]["failure"] == 0

        # Those mid-epoch resizes (2 -> 4 -> 2 -> 4) trained every sample of epoch 0 exactly once.
        wait_for(lambda: reached_epoch(samples, 1), timeout=90)
        counts = epoch_counts(samples, 0)
        assert sorted(counts) == list(range(DATASET)), "a sample was skipped"
        assert set(counts.values()) == {1}, "a sample was trained twice"

        # A forced checkpoint lands at the agreed step, and checkpoint age resets.
        mark = job.seq()
        reply = cli(job, "checkpoint")
        agreed = job.wait_event("step_agreed", lambda e: e["op_id"] == reply["op_id"], since=mark)
        saved = job.wait_event("checkpoint_saved", lambda e: e["request_id"] == reply["op_id"], since=mark)
        assert saved["step"] == agreed["at_step"] and saved["bytes"] > 0 and os.path.exists(saved["path"])
        # The age rides the node's heartbeat, which may trail the event by a beat.
        def rank0_age() -> float | None:
            return next((r["checkpoint_age_s"] for r in cli(job, "metrics")["ranks"] if r["rank"] == 0), None)
        wait_for(lambda: (age := rank0_age()) is not None and age < 10)

        # A SIGSTOPped worker is a hang: the job restarts with cause "hang", charged to no failure budget.
        mark = job.seq()
        victim = next(w for w in cli(job, "workers")["nodes"]["b"] if w["rank"] == 3)
        os.kill(victim["pid"], signal.SIGSTOP)
        hung = job.wait_event("round_started", lambda e: e["cause"] == "hang", since=mark, timeout=60)
        assert hung["world_size"] == 4
        restarts = job.status()["restarts"]
        assert restarts["hang"] == 1 and restarts["failure"] == 0
        job.wait_event("first_step", since=hung["seq"])


def test_kills_during_saves_always_leave_a_loadable_checkpoint(tmp_path: Path) -> None:
    ckpts = tmp_path / "ckpt"
    with Job(tmp_path, nnodes="1", nproc=1, max_restarts=10) as job:
        a = job.start("a", SHIM, "--steps", "100000", "--ckpt-dir", str(ckpts), "--ckpt-every", "1",
                      "--step-time", "0", "--batch", "16", "--keep", "2")
        resumed_from = []
        for kill in range(4):
            started = job.wait_event("round_started", lambda e, k=kill: e["round"] == k + 1)
            job.wait_event("first_step", since=started["seq"])
            wait_for(lambda: len(list(ckpts.glob("ckpt-*.pt"))) >= 2)
            os.kill(next(iter(job.worker_pids(started["seq"]))), signal.SIGKILL)  # it saves every step
            line = a.wait_line(rf"world_size=1 round={kill + 2} start_step=(\d+)")
            resumed_from.append(int(line.group(1)))
        assert all(step > 0 for step in resumed_from)  # every restart found a valid checkpoint to load
        assert resumed_from == sorted(resumed_from)
        assert "CorruptCheckpoint" not in a.output() and "Traceback" not in a.output()


def test_sigterm_of_a_member_drains_it_and_loses_no_step(tmp_path: Path) -> None:
    """A preemption notice (SIGTERM to b's elasticd) takes the drain path: the survivors resume at the next step."""
    samples = tmp_path / "samples"
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        args = ("--steps", "100000", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "0", "--step-time", "0.05",
                "--batch", "16", "--micro", "8", "--sample-log", str(samples))
        job.start("a", SHIM, *args)
        b = job.start("b", SHIM, *args)
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        job.wait_event("first_step", since=grown["seq"])
        wait_for(lambda: len(sample_lines(samples).get(1, [])) > 5)  # b's rank has trained a few steps
        mark = job.seq()
        b.signal(signal.SIGTERM)
        assert b.wait_exit(30) == 0
        assert "left the job: node b's elasticd received SIGTERM" in b.output()
        shrunk = job.wait_event("round_started", lambda e: e["world_size"] == 1, since=mark)
        assert not job.wait_event("drain_complete", since=mark)["timed_out"]
        job.wait_event("first_step", since=shrunk["seq"])
        wait_for(lambda: any(f"round{shrunk['round']}" in p.name and p.read_text() for p in samples.iterdir()))
        steps = [step for step, _ in sample_lines(samples)[0]]
        assert steps == list(range(1, len(steps) + 1)), "a step was lost or repeated across the leave"
        with job.client() as client:
            events = client.call("events", since_seq=mark, limit=0)["events"]
        kinds = [e["kind"] for e in events if e["kind"] in ("drain_started", "drain_complete", "node_left",
                                                            "node_lost", "round_started")]
        assert kinds == ["drain_started", "drain_complete", "node_left", "round_started"]
        assert job.status()["restarts"]["failure"] == 0


def test_sigterm_of_the_coordinators_node_stops_the_job_at_one_step_with_a_checkpoint(tmp_path: Path) -> None:
    """No coordinator failover yet, so the job ends; but it ends as `elasticd stop` does: nothing is lost."""
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        args = ("--steps", "100000", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "0", "--step-time", "0.05",
                "--batch", "16", "--micro", "8")
        a = job.start("a", SHIM, *args)
        b = job.start("b", SHIM, *args)
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        job.wait_event("first_step", since=grown["seq"])
        a.signal(signal.SIGTERM)
        assert a.wait_exit(30) == 0 and b.wait_exit(30) == 0
        saved = re.search(r"\[a:0\] drained at step=(\d+) checkpoint=(\S+)", a.output())  # rank 0 writes it
        assert saved is not None and os.path.exists(saved.group(2)), a.output()[-2000:]
        # every rank said `drained` at that step (no timeout): the checkpoint is the job's last step
        assert re.search(r"stop_complete .*timed_out=False", a.output()), a.output()[-2000:]
        assert "job_end state=stopped reason=node a's elasticd received SIGTERM" in a.output()


def test_a_worker_that_says_hello_after_its_node_answered_a_join_trains_nothing_in_the_round_that_ends(
        tmp_path: Path) -> None:
    """Its node answered the join's step query with no shim rank (no hello yet), so nobody waits for its save: a
    step it trained now would be lost with the restart and trained again. The daemon's `welcome` holds it."""
    hello, steps = tmp_path / "hello", tmp_path / "steps"
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        args = ("--wait-for", str(hello), "--keep-on-sigterm", "--step-log", str(steps))
        job.start("a", SHIM_TICKER, *args)
        job.wait_event("workers_started")
        job.start("b", SHIM_TICKER, *args)
        job.wait_event("step_agreed")  # the join's: node a's worker had not said hello
        hello.touch()
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        wait_for(lambda: steps.exists() and f"{grown['round']} 3" in steps.read_text())
        trained = [line.split()[:2] for line in steps.read_text().splitlines()]
        assert [step for round_id, step in trained if round_id == "1"] == []
