"""Forked workers show in ps as their script with a rank tag, so pkill -f finds them; the zygote names its job.
Workers keep the open-file limit the daemon was started with, while the daemon lifts its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from support.harness import PLAIN, TICKER, Job, free_port

from elasticd.job.runtime import NR_OPEN
from elasticd.member.processes.proctitle import worker_title, zygote_title

ENV = {"ELASTICD_JOB_ID": "j1", "ELASTICD_NODE_ID": "n1", "RANK": "3", "ELASTICD_ROUND": "7"}
TAG = "[elastic job=j1 node=n1 rank=3 round=7]"


def test_title_is_the_torchrun_command_line_then_the_tag() -> None:
    assert worker_title("/py", ["train.py", "--lr", "1"], ENV, 4096) == f"/py -u train.py --lr 1 {TAG}"
    assert worker_title("/py", ["-m", "pkg.train", "--lr", "1"], ENV, 4096) == f"/py -u -m pkg.train --lr 1 {TAG}"
    assert zygote_title(ENV) == "elasticd zygote job=j1 node=n1"


def test_arguments_that_do_not_fit_give_way_to_the_tag() -> None:
    title = worker_title("/py", ["train.py", "x" * 500], ENV, 100)
    assert len(title) == 100
    assert title.startswith("/py -u train.py xxx") and title.endswith(f"x ... {TAG}")


def test_title_fills_argv_and_leaves_the_environment_block_alone() -> None:
    probe = ("import sys; from elasticd.member.processes import proctitle; proctitle.reexec_with_title_room(); "
             "t = proctitle.worker_title('/py', ['train.py', 'y' * 9000], {}, proctitle.title_limit()); "
             "proctitle.set_title(t); print(t, flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", probe], env={**os.environ, "VIS_MARK": "kept"},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        title = proc.stdout.readline().rstrip("\n")
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().rstrip(b"\0").decode()
        assert cmdline == title and title.endswith(" ... [elastic job=? node=? rank=? round=?]")
        assert b"VIS_MARK=kept" in Path(f"/proc/{proc.pid}/environ").read_bytes()
    finally:
        proc.kill()
        proc.wait(5)


def ps_args() -> dict[int, str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    return {int(pid): args for pid, _, args in (line.strip().partition(" ") for line in out.splitlines())}


def test_ps_shows_script_and_rank_and_pkill_f_is_recovered_like_a_crash(tmp_path: Path) -> None:
    script = tmp_path / f"train_vis_{free_port()}.py"  # a name no other process has: pkill -f must hit only ours
    shutil.copy(PLAIN, script)
    with Job(tmp_path, nnodes="1", nproc=2) as job:
        script_args = ["--steps", "100000", "--snapshot", str(tmp_path / "s.pt"), "--step-time", "0.05"]
        daemon = job.start("a", script, *script_args)
        started = job.wait_event("workers_started")
        command = " ".join([sys.executable, "-u", str(script), *script_args])  # what torchrun's worker shows
        args = ps_args()
        for rank, pid in zip(started["ranks"], started["pids"], strict=True):
            assert args[pid] == f"{command} [elastic job={job.job_id} node=a rank={rank} round={started['round']}]"
            assert str(script).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        zygotes = [p.pid for p in psutil.Process(daemon.proc.pid).children() if p.pid not in started["pids"]]
        assert [args[pid] for pid in zygotes] == [f"elasticd zygote job={job.job_id} node=a"]

        assert subprocess.run(["pkill", "-f", f"{script.name}.*rank=1"]).returncode == 0
        exited = job.wait_event("worker_exited", since=started["seq"])
        assert exited["rank"] == 1 and exited["pid"] == started["pids"][1] and exited["exit_code"] != 0
        crash = job.wait_event("round_started", lambda e: e["cause"] == "failure", since=started["seq"])
        again = job.wait_event("workers_started", since=crash["seq"])
        daemon.wait_line(rf"\[a:0\] world_size=2 rank=0 round={again['round']} ")
        assert f"rank=1 round={again['round']}]" in ps_args()[again["pids"][1]]


@pytest.mark.parametrize("spawn", ["--preload=json", "--no-zygote"])
def test_daemon_lifts_its_open_file_limit_and_workers_keep_the_users(tmp_path: Path, spawn: str) -> None:
    hard = psutil.Process().rlimit(psutil.RLIMIT_NOFILE)[1]
    with Job(tmp_path, nnodes="1", nproc=2) as job:
        daemon = job.start("a", TICKER, extra=[spawn], prefix=["prlimit", f"--nofile=256:{hard}", "--"])
        started = job.wait_event("workers_started")
        expected = NR_OPEN if hard == psutil.RLIM_INFINITY else min(hard, NR_OPEN)
        assert psutil.Process(daemon.proc.pid).rlimit(psutil.RLIMIT_NOFILE) == (expected, hard)
        daemon.wait_line(rf"open files: soft limit 256 -> {expected} \(workers keep 256\)")
        for pid in started["pids"]:
            assert psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE) == (256, hard)
