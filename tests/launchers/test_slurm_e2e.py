"""Two daemons started as `srun` starts them, with no flag: they find each other from the step's environment, with
keys made for the job (and removed at its end), and SIGUSR1 (SLURM's `--signal=USR1@N` notice) is a graceful
leave, one node's or the whole job's."""

from __future__ import annotations

import random
import signal
import socket
from pathlib import Path

from support.harness import PORTS_LOW, SHIM_TICKER, DaemonProc, Job

from elasticd.cli.scheduler import OWNER
from elasticd.client import Credentials
from elasticd.job.slurm import PORT_BASE, PORT_SPAN


def job_id_with_a_free_port() -> str:
    """A SLURM job id whose derived rendezvous port is free here (tests run side by side), below the ports that
    tests/support/harness.py hands out."""
    while True:
        job_id = random.randrange(100_000, 10_000_000)
        if PORT_BASE + job_id % PORT_SPAN >= PORTS_LOW:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", PORT_BASE + job_id % PORT_SPAN))
            except OSError:
                continue
        return str(job_id)


def srun(job: Job, job_id: str, node: str, *args: str) -> DaemonProc:
    """One task of `srun --ntasks-per-node=1 elasticd start SCRIPT` on `node` of a two-node step."""
    env = {**job.env, "SLURM_JOB_ID": job_id, "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "localhost,127.0.0.1",
           "SLURMD_NODENAME": node, "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_CPUS_ON_NODE": "1",
           "SLURM_RESTART_COUNT": "1", "ELASTICD_SLURM_KEYS": str(job.tmp / "home-keys")}
    daemon = DaemonProc(["--log-dir", str(job.tmp / "logs"), "--preload", "json", str(SHIM_TICKER), *args],
                        job.tmp, env)
    job.daemons[node] = daemon
    job.started.append(daemon)
    daemon.wait_line(r"elasticd \S+: node |elasticd start: ")
    return daemon


def test_a_flagless_step_forms_one_job_and_sigusr1_is_a_graceful_leave(tmp_path: Path) -> None:
    with Job(tmp_path) as job:
        job_id = job_id_with_a_free_port()
        args = ("--interval", "0.05", "--resume", str(tmp_path / "saved"))
        first = srun(job, job_id, "localhost", *args)
        second = srun(job, job_id, "127.0.0.1", *args)
        keys = tmp_path / "home-keys" / job_id
        assert keys.parent.stat().st_mode & 0o777 == 0o700
        job.credentials = Credentials.load(str(keys / "clients" / f"{OWNER}.key_secret"),
                                           str(keys / "node" / "node.key"))
        both = job.wait_event("round_started", lambda e: e["world_size"] == 2, node="localhost")
        status = job.status("localhost")
        assert status["job_id"] == f"slurm-{job_id}-0" and status["coordinator"] == "localhost"
        assert status["scheduler"] == {"kind": "slurm", "job_id": job_id, "step_id": "0", "node": "localhost",
                                       "restart_count": 1, "keys": str(keys), "keys_owner": True}
        assert f"SLURM job {job_id} step 0 on 2 node(s), requeued 1x" in first.output()
        joined = job.wait_event("node_joined", lambda e: e["node"] == "127.0.0.1", node="localhost")
        assert joined["scheduler"] == {"kind": "slurm", "job_id": job_id, "step_id": "0", "restart_count": 1}
        job.wait_event("first_step", since=both["seq"], node="localhost")
        second.proc.send_signal(signal.SIGUSR1)  # one node's notice: it alone leaves, at an agreed step
        assert second.wait_exit(30) == 0
        alone = job.wait_event("round_started", lambda e: e["world_size"] == 1, since=both["seq"], node="localhost")
        assert alone["cause"] == "membership"
        job.wait_event("first_step", since=alone["seq"], node="localhost")  # the other node trains on
        first.proc.send_signal(signal.SIGUSR1)
        assert first.wait_exit(30) == 0
        output = first.output() + second.output()
        assert "Traceback" not in output, output[-6000:]
        assert not keys.exists()  # the job's keys went with the coordinator's node
