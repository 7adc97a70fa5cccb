"""Membership behaviour with real daemons and fast torch-free workers: env, limits, waiting, losses, ends."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from support.harness import TICKER, Job, job_processes, wait_gone


def test_workers_get_torchruns_env_contract(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=2) as job:
        a = job.start("a", TICKER)
        job.wait_event("round_started", lambda e: e["world_size"] == 2)
        b = job.start("b", TICKER)
        job.wait_event("round_started", lambda e: e["world_size"] == 4)
        env = json.loads(b.wait_line(r"\[b:3\] env=(.*)").group(1))
        round_id = job.status()["round"]
        assert env["RANK"] == "3" and env["LOCAL_RANK"] == "1" and env["WORLD_SIZE"] == "4"
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "1" and env["GROUP_WORLD_SIZE"] == "2"
        assert env["ROLE_RANK"] == "3" and env["ROLE_WORLD_SIZE"] == "4" and env["ROLE_NAME"] == "default"
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["TORCHELASTIC_MAX_RESTARTS"] == "3"
        assert env["TORCHELASTIC_RUN_ID"] == job.job_id == env["ELASTICD_JOB_ID"]
        assert env["OMP_NUM_THREADS"] == "1" and env["ELASTICD_NODE_ID"] == "b"
        assert env["ELASTICD_ROUND"] == str(round_id) and env["ELASTICD_WORKER_ADDR"].startswith("ipc://")
        a_env = json.loads(a.wait_line(r'\[a:0\] env=(.*"WORLD_SIZE": "4".*)').group(1))
        assert a_env["MASTER_PORT"] == env["MASTER_PORT"] and a_env["RANK"] == "0"


def test_restarts_exhausted_fail_the_job_on_every_node_with_the_reason(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="2", nproc=1, max_restarts=1) as job:
        a = job.start("a", TICKER, "--ticks", "5", "--exit-code", "7")
        b = job.start("b", TICKER, "--ticks", "100000")
        assert a.wait_exit(60) == 1
        assert b.wait_exit(30) == 1
        for daemon in (a, b):
            assert "--max-restarts 1 exhausted" in daemon.output()
            assert "exited with exit code 7" in daemon.output()
        assert wait_gone(job_processes(job.job_id)) == []


def test_below_min_nodes_waits_says_why_resumes_and_times_out(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="2:2", nproc=1, extra=["--join-timeout", "6"]) as job:
        a = job.start("a", TICKER)
        waiting = job.wait_event("waiting")
        assert "waiting for 1 more node(s)" in waiting["reason"]
        assert job.status()["state"] == "waiting"
        b = job.start("b", TICKER)
        running = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        b_pids = job.worker_pids(running["seq"])
        b.signal(signal.SIGTERM)
        assert b.wait_exit(30) == 0
        again = job.wait_event("waiting", since=running["seq"])
        assert "--nnodes min is 2" in again["reason"]
        assert wait_gone(b_pids | job.worker_pids(0)) == []  # the survivor stopped its workers too
        assert a.wait_exit(30) == 1
        assert "join timeout" in a.output()


FROZEN_S = 5.0  # past the 3 s loss limit, as a paused VM or a healed partition


def test_frozen_node_is_lost_and_rejoins_when_it_thaws(tmp_path: Path) -> None:
    """Frozen past the loss limit (SIGSTOP 5 s, like a partition that heals): the same daemon joins again."""
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        job.start("a", TICKER)
        b = job.start("b", TICKER)
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        b.signal(signal.SIGSTOP)
        frozen = time.monotonic()
        lost = job.wait_event("node_lost", lambda e: e["node"] == "b", since=grown["seq"])
        job.wait_event("round_started", lambda e: e["world_size"] == 1, since=lost["seq"])
        time.sleep(max(0.0, FROZEN_S - (time.monotonic() - frozen)))
        b.signal(signal.SIGCONT)
        back = job.wait_event("round_started", lambda e: e["world_size"] == 2, since=lost["seq"])
        assert back["rank_map"] == {"a": [0], "b": [1]} and back["cause"] == "membership"
        assert b.proc.poll() is None  # the same process, not a restart by hand
        assert job.status()["restarts"]["failure"] == 0
        assert "stopped answering" not in b.output()


def test_coordinator_sigkill_ends_members_cleanly_with_an_explanation(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        a = job.start("a", TICKER)
        b = job.start("b", TICKER)
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        b_workers = job.worker_pids(grown["seq"])
        a.kill_with_workers()
        assert b.wait_exit(30) == 3
        assert "stopped answering" in b.output() and "no coordinator HA" in b.output()
        assert wait_gone(b_workers) == []


def test_coordinator_sigterm_ends_the_job_everywhere(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        a = job.start("a", TICKER)
        b = job.start("b", TICKER)
        job.wait_event("round_started", lambda e: e["world_size"] == 2)
        a.signal(signal.SIGTERM)
        assert a.wait_exit(30) == 0
        assert b.wait_exit(30) == 0
        assert "it is the coordinator, so the job ends" in b.output()


@pytest.mark.parametrize("spawn", ["zygote", "exec"])
def test_workers_die_with_a_sigkilled_daemon(tmp_path: Path, spawn: str) -> None:
    with Job(tmp_path, nnodes="1", nproc=2, extra=["--no-zygote"] if spawn == "exec" else []) as job:
        a = job.start("a", TICKER)
        started = job.wait_event("workers_started")
        assert set(started["pids"]) <= set(job_processes(job.job_id))  # the orphan check below can see them
        a.proc.send_signal(signal.SIGKILL)  # the daemon alone; PDEATHSIG takes its workers down
        a.wait_exit(10)
        assert wait_gone(started["pids"]) == []
        assert wait_gone(job_processes(job.job_id)) == []  # the zygote too


def test_duplicate_node_id_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:3", nproc=1) as job:
        job.start("a", TICKER)
        job.wait_event("round_started")
        job.start("b", TICKER)
        job.wait_event("round_started", lambda e: e["world_size"] == 2)
        twin = job.start("b", TICKER)
        assert twin.wait_exit(30) == 2
        assert "node id 'b' is already in job" in twin.output()
        assert job.status()["world_size"] == 2


def test_a_worker_that_never_exits_after_its_peers_finished_is_stopped_and_the_job_ends(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1", nproc=2, extra=["--exit-timeout", "2"]) as job:
        a = job.start("a", TICKER, "--ticks", "3", "--interval", "0.01", "--forever-rank", "1")
        assert a.wait_exit(60) == 0
        assert "worker_exit_timeout round=1 timeout_s=2.0" in a.output()
        assert "succeeded: every worker of the final round finished" in a.output()
        assert wait_gone(job_processes(job.job_id)) == []


def test_sigterm_leave_with_slow_exiting_workers_is_exactly_one_round(tmp_path: Path) -> None:
    """While a leaving node's workers take seconds to exit, its heartbeats must not make it register again."""
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        job.start("a", TICKER)
        b = job.start("b", TICKER, "--term-delay", "2.5")
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        job.wait_event("workers_started", lambda e: e["node"] == "b", since=grown["seq"])
        b.signal(signal.SIGTERM)
        assert b.wait_exit(30) == 0  # after its slow workers are gone: any re-registration happened by now
        job.wait_event("round_started", lambda e: e["world_size"] == 1, since=grown["seq"])
        with job.client() as client:
            events = client.call("events", since_seq=grown["seq"], limit=0)["events"]
        kinds = [e["kind"] for e in events if e["kind"] in ("node_left", "node_joined", "node_lost", "round_started")]
        assert kinds == ["node_left", "round_started"]
        assert job.status()["restarts"]["failure"] == 0


def test_is_host_false_never_hosts_the_coordinator_and_signals_to_handle_choose_the_leave_signal(
        tmp_path: Path) -> None:
    """torchrun's --rdzv-conf is_host=false and --signals-to-handle, as Kubeflow launchers pass them."""
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        b = job.start("b", TICKER, extra=["--rdzv-conf", "is_host=false", "--signals-to-handle", "SIGUSR1"])
        b.wait_line(r"node b \(member\)")  # first on the endpoint's host, yet it only connects
        job.start("a", TICKER)
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 2, node="a")
        assert job.status("a")["coordinator"] == "a"
        b.signal(signal.SIGUSR1)
        assert b.wait_exit(30) == 0
        left = job.wait_event("node_left", since=grown["seq"], node="a")
        assert left["node"] == "b" and "SIGUSR1" in left["reason"]
