"""Why did it fail, from a third host with keys that cannot see the nodes' files (a mount namespace hides the log
folder): a rank's output and its follow, a crash's root cause, torch's @record error file, a hang's stack, live
stacks, and torchrun's summary when the job fails for good."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.harness import WORKERS, Job
from support.netlab import Lab
from support.two_hosts import IFNAMES

from elasticd.client import Credentials
from elasticd.keys.auth import KeyStore

TROUBLE = WORKERS / "trouble.py"
A, B = "node-a", "node-b"
HANG_TIMEOUT_S = 10.0  # a loaded machine stalls a 0.1 s step for seconds: no false hang


class Trouble:
    """Node A on host 0 (the coordinator), node B on host 1, one gloo rank each; the operator on the root namespace."""

    def __init__(self, lab: Lab, tmp: Path, shim: bool = False) -> None:
        self.lab, self.tmp = lab, tmp
        self.triggers = tmp / "triggers"
        self.triggers.mkdir()
        self.script_args = ["--triggers", str(self.triggers), *(["--shim"] if shim else [])]
        steps = [] if shim else ["--metrics-from-output", r"step (?P<step>\d+) loss (?P<loss>[\d.]+)"]
        self.job = Job(tmp, nnodes="2", nproc=1, max_restarts=1, rdzv_host=lab.addrs[0],
                       extra=["--hang-timeout", str(HANG_TIMEOUT_S), *steps])
        self.job.env = {k: v for k, v in self.job.env.items() if k not in IFNAMES}
        store = KeyStore(tmp / "keys")
        store.init()
        key, server = str(store.create_client("ops", "operator")), str(store.node_dir / "node.key")
        self.job.credentials = Credentials.load(key, server)
        self.auth = ["--key", key, "--server-key", server]

    def start(self, node: str, host: int) -> None:
        addr = self.lab.addrs[host]
        self.job.start(node, TROUBLE, *self.script_args, prefix=self.lab.run_in(host),
                       extra=["--keys", str(self.tmp / "keys"), "--control", f"tcp://{addr}:*",
                              "--pub", f"tcp://{addr}:*"])

    def operator(self, *args: str) -> list[str]:
        """An `elasticd` command line on the third host, in a mount namespace where the log folder is empty."""
        cli = " ".join([sys.executable, "-m", "elasticd.cli", *map(quote, args), "--connect",
                        self.job.daemon(A).control, *self.auth])
        return ["unshare", "--mount", "sh", "-c", f"mount -t tmpfs none {self.tmp / 'logs'} && exec {cli}"]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.operator(*args), env=self.job.env, capture_output=True, text=True, timeout=30)

    def json(self, *args: str) -> dict[str, Any]:
        done = self.cli(*args, "--json")
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def steps(self, node: str) -> list[int]:
        lines = self.json("logs", node, "--tail", "50")["ranks"][0]["lines"]
        return [int(m[1]) for line in lines if (m := re.match(r"step (\d+) ", line))]


def quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with Lab(2) as hosts:
        yield hosts


@contextmanager
def running(lab: Lab, tmp: Path, shim: bool = False) -> Iterator[Trouble]:
    job = Trouble(lab, tmp, shim)
    with job.job:
        job.start(A, 0)
        job.start(B, 1)
        job.job.wait_event("first_step")
        yield job


@pytest.fixture(scope="module")
def trouble(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trouble]:
    """A plain script: its steps are its `step N loss X` lines (--metrics-from-output)."""
    with running(lab, tmp_path_factory.mktemp("trouble")) as job:
        yield job


def test_the_operator_cannot_see_the_log_folder(trouble: Trouble) -> None:
    """The premise: the mount namespace hides the nodes' files from the operator's commands."""
    seen = subprocess.run(["unshare", "--mount", "sh", "-c", f"mount -t tmpfs none {trouble.tmp / 'logs'} && "
                           f"ls -A {trouble.tmp / 'logs'}"], capture_output=True, text=True, timeout=10)
    assert seen.returncode == 0 and seen.stdout.strip() == ""
    assert (trouble.tmp / "logs").exists() and any((trouble.tmp / "logs").iterdir())


def test_logs_of_a_rank_on_another_host_and_a_follow_that_sees_new_lines(trouble: Trouble) -> None:
    reply = trouble.json("logs", B, "1", "--tail", "5")
    entry = reply["ranks"][0]
    assert entry["rank"] == 1 and entry["state"] == "running" and entry["source"] == "file"
    assert 0 < len(entry["lines"]) <= 5 and entry["lines"][-1].startswith("step ")
    last = trouble.steps(B)[-1]
    follow = subprocess.Popen(trouble.operator("logs", B, "1", "--tail", "1", "--follow"), env=trouble.job.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()
        assert first.startswith("step "), first
        newer = follow.stdout.readline()  # the job steps every 0.1 s: a new line comes at the next poll
        assert int(newer.split()[1]) > int(first.split()[1]) >= last
    finally:
        follow.kill()
        follow.wait()


def test_live_stacks_name_where_a_rank_is_and_it_keeps_training(trouble: Trouble) -> None:
    before = trouble.steps(B)[-1]
    dumps = trouble.json("stacks", B)["ranks"]
    assert [d["rank"] for d in dumps] == [1]
    assert "trouble.py" in dumps[0]["text"] and "in main" in dumps[0]["text"], dumps[0]
    assert "zygote.py" not in dumps[0]["text"]  # the frames that run every script are left out
    deadline = time.monotonic() + 10
    while trouble.steps(B)[-1] <= before + 5:
        assert time.monotonic() < deadline, "rank 1 stopped training after its stacks were taken"
        time.sleep(0.3)


def test_a_crash_names_its_root_cause_from_another_host_within_two_seconds(trouble: Trouble) -> None:
    seq = trouble.job.seq()
    (trouble.triggers / "crash-1").touch()
    cause = trouble.job.wait_event("worker_failed", lambda e: e.get("root_cause") is True, since=seq, timeout=30)
    events = trouble.json("events", "--kind", "worker_failed")["events"]
    status = trouble.json("status")
    roots = [e for e in events if e["seq"] > seq and e.get("root_cause")]
    assert [(e["node"], e["rank"]) for e in roots] == [(B, 1)]
    error = roots[0]["error"]
    assert error["type"] == "ValueError" and error["message"].startswith("bad batch at step")
    assert error["where"].startswith("trouble.py:") and error["where"].endswith("in train_step")
    assert error["source"] == "error_file"  # torch's @record wrote it, and that is what the event carries
    assert status["root_cause"]["node"] == B and status["root_cause"]["error"]["type"] == "ValueError"
    round_failed = cause["round"]
    trouble.job.wait_event("first_step", lambda e: e.get("round", 0) > round_failed, since=seq)
    echoes = [e for e in trouble.json("events", "--kind", "worker_failed")["events"]
              if e["seq"] > seq and e.get("round") == round_failed and e["seq"] != roots[0]["seq"]]
    # rank 0, in the all-reduce with the dead rank, may fail before its round is replaced: never a second cause
    assert all(e["root_cause"] is False and e["consequence_of"] == {"node": B, "rank": 1} for e in echoes), echoes
    text = trouble.cli("events", "--kind", "worker_failed").stdout
    assert "ValueError" in text and "bad batch" in text
    old = trouble.json("logs", B, "1", "--round", str(round_failed), "--tail", "40")["ranks"][0]
    assert old["state"] in ("failed", "unknown") and any("ValueError: bad batch" in line for line in old["lines"])


def test_a_hang_event_names_the_blocked_function(trouble: Trouble) -> None:
    assert_hang_named(trouble)


def test_a_shim_scripts_hang_event_names_the_blocked_function(lab: Lab, tmp_path: Path) -> None:
    """The same hang in a script that reports its steps through trainer_shim, not by printing them."""
    with running(lab, tmp_path, shim=True) as trouble:
        printed = trouble.json("logs", B, "--tail", "50")["ranks"][0]["lines"]
        assert not any(line.startswith("step ") for line in printed)  # its steps reach the daemon by the shim
        assert_hang_named(trouble)


def assert_hang_named(trouble: Trouble) -> None:
    seq = trouble.job.seq()
    (trouble.triggers / "hang-1").touch()
    hung = trouble.job.wait_event("worker_hung", lambda e: e.get("rank") == 1, since=seq, timeout=60)
    assert hung["node"] == B and hung["stack"]["where"].endswith("in wait_forever"), hung
    events = trouble.json("events", "--kind", "worker_hung")["events"]
    assert any(e["seq"] == hung["seq"] and "wait_forever" in e["stack"]["text"] for e in events)
    cause = trouble.job.wait_event("worker_failed", lambda e: e.get("root_cause") is True, since=seq, timeout=30)
    assert (cause["node"], cause["rank"], cause["hang"]) == (B, 1, True)
    trouble.job.wait_event("first_step", lambda e: e.get("round", 0) > hung.get("round", cause["round"]), since=seq)


def test_a_job_that_fails_for_good_prints_the_root_cause_on_every_daemon(trouble: Trouble) -> None:
    seq = trouble.job.seq()
    (trouble.triggers / "crash-0").touch()  # --max-restarts 1 was spent by the first crash: this one ends the job
    end = trouble.job.wait_event("job_end", since=seq, timeout=60)
    assert end["state"] == "failed" and end["root_cause"]["node"] == A
    for node in (A, B):
        daemon = trouble.job.daemon(node)
        daemon.wait_exit(30)
        out = daemon.output()
        assert "Root Cause (first observed failure)" in out and "ValueError: bad batch" in out, out[-3000:]
