"""Node health with real daemons (docs/health.md): a failing check, NVML faults through a stand-in pynvml, a lemon.
Each sick node leaves gracefully, a warm spare takes its place, and the operator lets it back."""

from __future__ import annotations

import json
from pathlib import Path

from support.harness import ROOT, SHIM, TICKER, Job, sample_lines, wait_for

from elasticd.client import Client

STAND_IN = ROOT / "tests" / "support" / "nvml_stand_in"
SICK = "nvme0: SMART critical warning"


def check(flags: Path, node: str) -> list[str]:
    """A site's health command that fails once the test drops a file named after the node."""
    return ["--health-check", f"test ! -e {flags}/{node} || {{ echo checking; echo '{SICK}'; exit 1; }}",
            "--health-interval", "0.5", "--health-timeout", "5"]


def test_a_node_whose_check_fails_is_drained_losing_no_step_and_a_spare_takes_its_place(tmp_path: Path) -> None:
    flags, samples = tmp_path / "flags", tmp_path / "samples"
    flags.mkdir()
    args = ("--steps", "100000", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "0", "--step-time", "0.05",
            "--batch", "24", "--micro", "4", "--sample-log", str(samples))
    with Job(tmp_path, nnodes="2:3", nproc=1) as job:
        for node in "abcd":
            job.start(node, SHIM, *args, extra=check(flags, node))
        full = job.wait_event("round_started", lambda e: e["world_size"] == 3)
        job.wait_event("first_step", since=full["seq"])
        spare = next(n for n in "abcd" if n not in full["rank_map"])
        job.wait_event("node_joined", lambda e: e["node"] == spare)  # its zygote may warm up after the round
        wait_for(lambda: job.status()["spares"] == {"ready": 1, "warming": 0})  # its workers pre-started
        assert next(n for n in job.status()["nodes"] if n["node_id"] == spare)["spare"] == "ready"
        wait_for(lambda: len(sample_lines(samples).get(2, [])) > 5)

        sick = list(full["rank_map"])[1]
        (flags / sick).touch()
        verdict = job.wait_event("node_unhealthy", since=full["seq"])
        assert (verdict["node"], verdict["reasons"]) == (sick, [f"command: {SICK}"])
        assert verdict["action"].startswith("cordon: it leaves at one agreed step")
        replaced = job.wait_event("round_started", lambda e: spare in e["rank_map"], since=verdict["seq"])
        assert sick not in replaced["rank_map"] and replaced["world_size"] == 3
        assert replaced["ts"] - verdict["ts"] < 10  # seconds at most even on a loaded machine (bench: well under 2)
        job.wait_event("first_step", since=replaced["seq"])
        wait_for(lambda: any(f"round{replaced['round']}" in p.name and p.read_text() for p in samples.iterdir()))
        steps = [step for step, _ in sample_lines(samples)[0]]
        assert steps == list(range(1, len(steps) + 1)), "a step was lost or repeated when the sick node left"
        row = next(n for n in job.status()["nodes"] if n["node_id"] == sick)
        assert row["role"] == "cordoned" and row["health"] == [f"command: {SICK}"] and "command" in row["checks"]
        assert job.status()["restarts"]["failure"] == 0

        (flags / sick).unlink()  # fixed: it says so, and waits for the operator
        job.wait_event("node_healthy", lambda e: e["node"] == sick, since=verdict["seq"])
        with job.client() as client:
            assert client.call("uncordon", node=sick)["ok"]
        assert next(n for n in job.status()["nodes"] if n["node_id"] == sick)["role"] == "standby"


def test_nvml_faults_give_named_reasons_and_each_sick_node_leaves(tmp_path: Path) -> None:
    states = {n: tmp_path / f"nvml-{n}.json" for n in "abc"}
    for path in states.values():
        path.write_text(json.dumps({"ecc": 1}))
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        job.env["PYTHONPATH"] = f"{STAND_IN}:{ROOT}"  # the stand-in is the daemons' pynvml
        for node in "abc":
            job.env["FAKE_NVML_STATE"] = str(states[node])
            job.start(node, TICKER, extra=["--health-interval", "0.5"])
        full = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        spare = next(n for n in "abc" if n not in full["rank_map"])
        member = next(n for n in full["rank_map"] if n != "a")
        wait_for(lambda: job.status()["spares"]["ready"] == 1)
        states[member].write_text(json.dumps({"ecc": 1, "xids": [79]}))
        xid = job.wait_event("node_unhealthy", since=full["seq"])
        assert (xid["node"], xid["reasons"]) == (member, ["xid: GPU 0: XID 79"])
        replaced = job.wait_event("round_started", lambda e: spare in e["rank_map"], since=xid["seq"])
        assert member not in replaced["rank_map"]
        # A node's checks are those of its last report: `[]` until its first, which a daemon started last may not
        # have sent yet on a loaded machine (two full runs here read the spare's too early).
        wait_for(lambda: next(n for n in job.status()["nodes"] if n["node_id"] == spare)["checks"] ==
                 ["xid", "ecc", "retired_pages", "row_remap", "throttle", "log_dir"])

        states[spare].write_text(json.dumps({"ecc": 4}))  # the spare's GPU now: three new uncorrectable errors
        ecc = job.wait_event("node_unhealthy", lambda e: e["node"] == spare, since=replaced["seq"])
        assert ecc["reasons"] == ["ecc: GPU 0: uncorrectable ECC errors 1 -> 4"]
        alone = job.wait_event("round_started", lambda e: e["world_size"] == 1, since=ecc["seq"])
        assert list(alone["rank_map"]) == ["a"]
        assert job.status()["unhealthy"] == sorted([member, spare])


def test_a_node_that_keeps_failing_is_cordoned_as_a_lemon_and_uncordon_brings_it_back(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=1, max_restarts=10) as job:
        job.start("a", TICKER)
        b = job.start("b", TICKER, "--ticks", "3", "--interval", "0.1", "--exit-code", "3")
        lemon = job.wait_event("node_unhealthy", timeout=90)
        assert lemon["node"] == "b" and lemon["reasons"] == ["lemon: 3 root-cause failures within 600s"]
        alone = job.wait_event("round_started", lambda e: list(e["rank_map"]) == ["a"], since=lemon["seq"])
        failures = [e for e in Client(job.daemon().control).call("events", kinds=["worker_failed"], limit=0)["events"]]
        assert [e["node"] for e in failures if e.get("root_cause")] == ["b", "b", "b"]
        a_ticks = len(job.daemon("a").output().splitlines())
        wait_for(lambda: len(job.daemon("a").output().splitlines()) > a_ticks + 5)  # the job trains on without it
        assert job.status()["state"] == "running" and b.proc.poll() is None
        assert next(n for n in job.status()["nodes"] if n["node_id"] == "b")["role"] == "cordoned"
        with job.client() as client:
            assert client.call("uncordon", node="b")["ok"]
        job.wait_event("round_started", lambda e: e["world_size"] == 2, since=alone["seq"])
