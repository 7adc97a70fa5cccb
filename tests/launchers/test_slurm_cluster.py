"""examples/slurm/train.sbatch on a real 2-node SLURM cluster (tests/support/slurm_cluster.py): no elasticd flag
for the job (only its drain budget, --grace-period); it
trains at world 2, `scontrol requeue` resumes it from the step its leave saved (0 lost, same rendezvous id), and
`scancel --signal=USR1` (what `--signal=USR1@N` sends) stops it at one agreed step; with `--no-kill` a lost node
leaves the other training; two tasks per node are refused."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.harness import sample_lines
from support.slurm_cluster import SlurmCluster

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as up:
        yield up


def until(condition: Callable[[], bool], timeout: float, what: str, cluster: SlurmCluster, job: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout:.0f}s; job {job}: {cluster.job(job).get('JobState')}\n"
                                 f"{cluster.output(job)[-5000:]}")
        time.sleep(0.3)


def submit(cluster: SlurmCluster, tmp: Path, *script_args: str) -> str:
    """The example as a user submits it from the checkout, with elasticd on PATH (an activated venv)."""
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "CKPT_DIR": str(tmp / "ckpt"),
           "ELASTICD_SLURM_KEYS": str(tmp / "keys")}
    return cluster.sbatch(str(SBATCH), "--steps", "100000", "--step-time", "0.05", "--batch", "12", "--micro", "4",
                          "--log-every", "50", "--ckpt-every", "0", "--sample-log", str(tmp / "samples"),
                          *script_args, env=env, cwd=ROOT)


def trained(samples: Path) -> list[int]:
    """Rank 0's steps over both runs (each run's rounds start at 1 again: order by step, keep repeats)."""
    return sorted(step for step, _ in sample_lines(samples).get(0, []))


def test_the_example_trains_at_world_two_resumes_after_a_requeue_and_stops_on_usr1(cluster: SlurmCluster,
                                                                                   tmp_path: Path) -> None:
    job = submit(cluster, tmp_path)
    samples = tmp_path / "samples"
    until(lambda: "world_size=2" in cluster.output(job), 120, "training at world 2", cluster, job)
    output = cluster.output(job)
    assert f"SLURM job {job} step 0 on 2 node(s): rendezvous node1:" in output and "--nproc-per-node 1" in output
    until(lambda: samples.is_dir() and len(trained(samples)) > 20, 60, "20 steps", cluster, job)
    before = max(trained(samples))
    cluster.run("scontrol", "requeue", job)  # SIGTERM to every node's elasticd, then SLURM starts the job again
    until(lambda: "requeued 1x" in cluster.output(job) and "first_step" in cluster.output(job).split("requeued 1x")[-1],
          120, "the requeued run's first step", cluster, job)
    assert f"--rdzv-id slurm-{job}-0" in cluster.output(job).split("requeued 1x")[-1]  # the same rendezvous id
    until(lambda: max(trained(samples)) > before + 40, 60, "steps after the requeue", cluster, job)
    cluster.run("scancel", "--signal=USR1", job)  # every node's notice at once
    until(lambda: cluster.job(job).get("JobState") == "COMPLETED", 60, "the job's end", cluster, job)
    assert cluster.job(job)["ExitCode"] == "0:0" and "Traceback" not in cluster.output(job)
    assert "step_agreed" in cluster.output(job).split("requeued 1x")[-1]  # one agreed step, saved there
    steps = trained(samples)
    assert steps == list(range(1, len(steps) + 1))  # resumed after the step the leave saved: 0 lost, 0 repeated
    assert not (tmp_path / "keys" / job).exists()  # the job's own keys went with it


def elasticd_of(cluster: SlurmCluster, node: int, job: str) -> int:
    """The pid of `job`'s elasticd on node `node`."""
    for pid in cluster.pids(node):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if b"start" in argv and any(a.endswith(b"/elasticd") for a in argv) and f"SLURM_JOB_ID={job}".encode() in env:
            return pid
    raise AssertionError(f"no elasticd of job {job} on node{node + 1}")


def test_two_jobs_share_the_nodes_and_one_nodes_usr1_is_that_nodes_leave(cluster: SlurmCluster,
                                                                           tmp_path: Path) -> None:
    # Two DDP jobs beside the rest of the suite: a slower step keeps their four workers' CPU low
    first, second = (submit(cluster, tmp_path / name, "--step-time", "0.25") for name in ("first", "second"))
    for job in (first, second):  # each on both nodes at once, each on its own port
        until(lambda job=job: "world_size=2" in cluster.output(job), 120, "training at world 2", cluster, job)
    ports = {job: cluster.output(job).split("rendezvous node1:")[1].split()[0] for job in (first, second)}
    assert ports[first] != ports[second]
    os.kill(elasticd_of(cluster, 1, first), signal.SIGUSR1)  # node2's notice, in the first job only
    try:
        until(lambda: "world_size=1" in cluster.output(first).split("received SIGUSR1")[-1], 60, "node1 alone",
              cluster, first)
        assert cluster.job(first)["JobState"] == "RUNNING" and "received SIGUSR1" not in cluster.output(second)
    finally:
        cluster.run("scancel", first, second, check=False)


def test_two_tasks_per_node_fail_at_once_with_the_fix(cluster: SlurmCluster, tmp_path: Path) -> None:
    result = cluster.run("srun", "-N1", "--ntasks-per-node=2", sys.executable, "-m", "elasticd.cli",
                         "start", str(ROOT / "tests" / "workers" / "ticker.py"), check=False, cwd=tmp_path)
    assert result.returncode != 0
    assert "elasticd is one task per node" in result.stderr + result.stdout
    assert "srun --ntasks-per-node=1 elasticd start" in result.stderr + result.stdout


def test_with_no_kill_a_lost_node_leaves_the_other_training(cluster: SlurmCluster, tmp_path: Path) -> None:
    job = submit(cluster, tmp_path, "--step-time", "0.25")
    until(lambda: "world_size=2" in cluster.output(job), 120, "training at world 2", cluster, job)
    cluster.kill_node(1)  # node2: its slurmd, its elasticd and its worker, all at once
    try:
        # node1 alone after the loss: a first round of one, before node2 joined, also printed world_size=1
        until(lambda: "world_size=1" in cluster.output(job).partition("node_lost")[2], 60, "node1 alone", cluster,
              job)
        assert "node_lost" in cluster.output(job) and cluster.job(job)["JobState"] == "RUNNING"
    finally:
        cluster.run("scancel", job, check=False)
        cluster.start_node(1)  # back for the next test: ReturnToService=2 lets it in when it registers
