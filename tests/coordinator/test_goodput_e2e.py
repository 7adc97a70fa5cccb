"""Goodput of a real job with a known history, against what rank 0's own step log shows from outside."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from support.harness import SHIM_TICKER, Job, ticker_steps, wait_for

SAVE_S = 0.6  # each requested save (the forced checkpoint, the join's agreed step)


def stepping(logs: dict[str, Path], rnd: dict, nodes: str) -> None:
    """Wait until each of these nodes' ranks stepped in that round. Its `first_step` is the first rank's: under
    load another one's process may start stepping seconds later (these ranks share no collective)."""
    def stepped(node: str) -> bool:
        return any(r == rnd["round"] for r, _, _ in ticker_steps(logs[node]))
    wait_for(lambda: all(stepped(n) for n in nodes), timeout=60)


def test_goodput_accounts_a_jobs_crash_joins_drain_and_saves_as_seen_from_outside(tmp_path: Path) -> None:
    logs = {node: tmp_path / f"steps-{node}" for node in "abc"}  # one rank per node
    with Job(tmp_path, nnodes="1:3", nproc=1) as job:
        job.env["ELASTICD_REPORT_INTERVAL"] = "0"  # every step reaches the daemon: the redone steps are exact
        # In lockstep, as ranks in one collective are: the job stops when rank 0 stops to save.
        args = ("--interval", "0.05", "--save-s", str(SAVE_S), "--resume", str(tmp_path / "saved"),
                "--lockstep", str(tmp_path))
        job.start("a", SHIM_TICKER, *args, "--step-log", str(logs["a"]))
        begun = time.time()  # the coordinator is up: the job's time starts about now
        job.start("b", SHIM_TICKER, *args, "--step-log", str(logs["b"]))
        pair = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        job.wait_event("first_step", since=pair["seq"])
        stepping(logs, pair, "ab")
        time.sleep(1.5)
        mark = job.seq()
        with job.client() as client:
            forced = client.call("checkpoint")["op_id"]
        job.wait_event("checkpoint_saved", lambda e: e["request_id"] == forced, since=mark)
        time.sleep(1.5)
        mark = job.seq()
        with job.client() as client:
            started = client.call("events", kinds=["workers_started"], since_seq=pair["seq"], limit=0)["events"]
        victim = next(e["pids"][0] for e in started if e["node"] == "b")
        os.kill(victim, signal.SIGKILL)
        killed = time.time()
        crashed = job.wait_event("round_started", lambda e: e["cause"] == "failure", since=mark)
        job.wait_event("first_step", since=crashed["seq"])
        stepping(logs, crashed, "ab")
        time.sleep(1.5)
        job.start("c", SHIM_TICKER, *args, "--step-log", str(logs["c"]))
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 3, since=crashed["seq"])
        job.wait_event("first_step", since=grown["seq"])
        stepping(logs, grown, "abc")
        time.sleep(1.5)
        with job.client() as client:
            client.call("drain", node="c")
        drained = job.wait_event("round_started", lambda e: e["world_size"] == 2, since=grown["seq"])
        job.wait_event("first_step", since=drained["seq"])
        stepping(logs, drained, "ab")
        time.sleep(1.5)
        with job.client() as client:
            report = client.call("goodput")
        asked = time.time()

    steps, ranks = ticker_steps(logs["a"]), [ticker_steps(log) for log in logs.values() if log.exists()]
    life = report["life"]
    rounds = sorted({r for r, _, _ in steps})  # a may have trained alone before b joined
    assert rounds[-4:] == [pair["round"], crashed["round"], grown["round"], drained["round"]]
    joins = [n for n in rounds[1:] if n not in (crashed["round"], drained["round"])]
    # A stall as the job sees it: from the first rank that stopped (to save at the agreed step) to the first rank's
    # first step in the new world. In lockstep, the ranks are within a step of each other.
    began = {n: min(t for log in ranks for r, _, t in log if r == n) for n in rounds}
    stopped = {n: min(max(t for r, _, t in log if r == n) for log in ranks if any(r == n for r, _, _ in log))
               for n in rounds}
    # Every second of the job is in one bucket.
    assert life["accounted_s"] == pytest.approx(report["wall_s"], abs=0.01)
    assert report["wall_s"] >= 0.95 * (asked - begun)
    # The steps trained twice after the crash: those after the forced checkpoint's step, up to the restart.
    resumed = next(s for r, s, _ in steps if r == crashed["round"])
    reached = max(s for r, s, _ in steps if r == pair["round"])
    assert report["redone_steps"] == reached - (resumed - 1)
    # Each stall as seen from outside: the crash's recovery; each join's and the drain's save at the agreed step,
    # and the recovery after it.
    assert life["recovery"]["crash"] == pytest.approx(began[crashed["round"]] - killed, rel=0.1, abs=0.1)
    stalled = sum(began[n] - stopped[rounds[rounds.index(n) - 1]] for n in joins)
    assert life["recovery"]["join"] + SAVE_S * len(joins) == pytest.approx(stalled, rel=0.1, abs=0.1)
    drain_stall = began[drained["round"]] - stopped[grown["round"]]
    assert life["recovery"]["leave"] + SAVE_S == pytest.approx(drain_stall, rel=0.1, abs=0.1)
    assert life["checkpoint"] == pytest.approx(SAVE_S * (2 + len(joins)), abs=0.1)
    # Training: the time the job stepped in each round, less the forced save (the redone steps are within it). A
    # round trains from its first rank's first step to its first rank's last, as the stalls above end and begin
    # (rank 0's own first and last steps drift from those by tenths of a second under load, in every round).
    # The crash stopped the job's training at the kill (rank 0 waited for its dead peer until its round stopped).
    ends = {**stopped, pair["round"]: killed, rounds[-1]: asked}
    stepped = sum(ends[n] - began[n] for n in rounds) - SAVE_S
    assert life["training"] + life["redone"] == pytest.approx(stepped, rel=0.1)
