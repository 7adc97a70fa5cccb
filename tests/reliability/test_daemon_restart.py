"""Daemon restarts: a SIGKILLed elasticd started again on the same node rejoins cleanly under the same id, what a
SIGKILLed daemon leaves behind (endpoint files, worker-channel ipc sockets, half-written files) never blocks a
start, and a second daemon on ports another one holds gets one clear line and exit 2.
(A live duplicate node id: tests/coordinator/test_membership.py::test_duplicate_node_id_is_refused_with_a_clear_error.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.harness import TICKER, Job, free_port, job_processes, wait_gone

from elasticd.job.runtime import id_digest


def runtime_files(job: Job, node: str) -> list[Path]:
    """That node's endpoint file and worker-channel sockets (named by a digest of the ids: short paths)."""
    run = job.tmp / "run"
    return sorted([*run.glob(f"{job.job_id}--{node}*"), *run.glob(f"w-{id_digest(f'{job.job_id}--{node}')}-*")])


def test_a_sigkilled_member_restarted_on_the_same_node_rejoins(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        job.start("a", TICKER)
        job.start("b", TICKER)
        joined = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        old = {n["node_id"]: n["instance"] for n in job.status()["nodes"]}
        pids = job.daemons["b"].kill_with_workers()
        assert wait_gone(pids) == []
        left = [p.name for p in runtime_files(job, "b")]
        assert f"{job.job_id}--b.json" in left and any(p.endswith(".sock") for p in left), left  # stale

        mark = job.seq()
        again = job.start("b", TICKER)  # at once: inside the window where the old b is not yet declared lost
        lost = job.wait_event("node_lost", lambda e: e["node"] == "b", since=mark)
        rejoined = job.wait_event("node_joined", lambda e: e["node"] == "b", since=lost["seq"])
        final = job.wait_event("round_started", lambda e: e["world_size"] == 2 and "b" in e["rank_map"],
                               since=rejoined["seq"])
        status = job.status()
        nodes = {n["node_id"]: n for n in status["nodes"]}
        assert set(nodes) == {"a", "b"} and nodes["b"]["status"] == "alive" and nodes["b"]["instance"] != old["b"]
        assert (status["round"], status["world_size"], status["restarts"]["failure"]) == (final["round"], 2, 0)
        assert final["rank_map"]["a"] == joined["rank_map"]["a"]  # a keeps its ranks (sticky)
        assert again.proc.poll() is None and "already in job" not in again.output()
        info = json.loads((job.tmp / "run" / f"{job.job_id}--b.json").read_text())
        assert info["pid"] == again.proc.pid  # the stale endpoint file was replaced
        assert job.client("b").call("status")["world_size"] == 2  # and the new b serves the job
    assert wait_gone(job_processes(job.job_id)) == []


def test_stale_runtime_files_never_block_a_start(tmp_path: Path) -> None:
    """A coordinator SIGKILLed twice, with junk added to what it left behind, starts again on the same ports."""
    # A port of the tests' own slice: a daemon's default is an ephemeral one, which any test's connect may take
    # while this daemon lies dead, and the restart would then fail for a reason not its own.
    control = f"tcp://127.0.0.1:{free_port()}"
    with Job(tmp_path, nnodes="1:1", nproc=1) as job:
        for attempt in range(2):
            a = job.start("a", TICKER, extra=["--control", control])
            job.wait_event("workers_started")
            assert a.control == control
            assert wait_gone(a.kill_with_workers()) == []
            run = job.tmp / "run"
            assert (run / f"{job.job_id}--a.json").exists()
            (run / f"{job.job_id}--a.tmp").write_text("{half")  # a crash inside write_endpoints
            if attempt:
                (run / f"{job.job_id}--a.json").write_text("not json")  # a torn endpoint file
            (run / f"w-{id_digest(f'{job.job_id}--a')}-1.sock").write_text("")  # a worker socket of a dead pid
        a = job.start("a", TICKER, extra=["--control", control])  # the SIGKILLed daemon's own control port
        job.wait_event("workers_started")
        assert a.control == control and a.proc.poll() is None
        cli = subprocess.run([sys.executable, "-m", "elasticd.cli", "status", "--json"], cwd=tmp_path,
                             env=job.env, capture_output=True, text=True, timeout=30)  # discovery finds the live one
        assert cli.returncode == 0 and json.loads(cli.stdout)["state"] == "running", cli.stderr


@pytest.mark.parametrize("flag", ["--control", "--pub"])
def test_ports_held_by_another_daemon_are_one_clear_line_and_exit_2(tmp_path: Path, flag: str) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        a = job.start("a", TICKER)
        job.wait_event("workers_started")
        taken = a.control if flag == "--control" else a.pub
        b = job.start("b", TICKER, extra=[flag, taken])
        assert b.wait_exit(30) == 2
        lines = [line for line in b.output().splitlines() if line.strip()]
        assert len(lines) == 1 and taken in lines[0] and "in use" in lines[0], lines
        assert "Traceback" not in b.output()
        assert a.proc.poll() is None and job.status()["world_size"] == 1  # the running daemon is untouched
