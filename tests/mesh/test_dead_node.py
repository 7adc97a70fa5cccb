"""Real daemons: a SIGKILLed member is noticed by its closed connection; a frozen one that thaws costs nothing."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq
from support.harness import TICKER, DaemonProc, Job, secure

from elasticd.client import parse_telemetry

MEMBERSHIP = ("node_lost", "node_left", "node_joined", "round_started")
FREEZE_S = 2.0  # 2 of the 3 s the heartbeat rule allows


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_a_sigkilled_member_is_lost_by_its_closed_connection_and_the_job_goes_on(tmp_path: Path,
                                                                                   curve: bool) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        if curve:
            secure(job)
        a = job.start("a", TICKER)
        b = job.start("b", TICKER)
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        job.wait_event("workers_started", lambda e: e["node"] == "b", since=grown["seq"])
        b.kill_with_workers()
        lost = job.wait_event("node_lost", lambda e: e["node"] == "b", since=grown["seq"])
        assert lost["reason"] == "node b's connection closed"  # not "missed 3 heartbeats"
        smaller = job.wait_event("round_started", lambda e: e["world_size"] == 1, since=lost["seq"])
        job.wait_event("workers_started", lambda e: e["node"] == "a", since=smaller["seq"])
        a.wait_line(r"\[a:0\] tick=\d+ rank=0 world=1")  # training goes on in the smaller world
        status = job.status()
        assert (status["state"], status["world_size"], status["restarts"]["failure"]) == ("running", 1, 0)
        with job.client() as client:
            events = client.call("events", since_seq=grown["seq"], limit=0)["events"]
        assert [e["kind"] for e in events if e["kind"] in MEMBERSHIP] == ["node_lost", "round_started"]


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def freeze_right_after_a_heartbeat(daemon: DaemonProc) -> float:
    """SIGSTOP just after the daemon's heartbeat went out (it publishes the same beat on its PUB); the beat's time,
    which on a loaded machine may be well before this test heard it."""
    with zmq.Context.instance().socket(zmq.SUB) as sub:
        sub.setsockopt(zmq.SUBSCRIBE, b"hb.")
        sub.setsockopt(zmq.RCVTIMEO, 10_000)
        sub.connect(daemon.pub)
        beat = parse_telemetry(sub.recv_multipart())
        daemon.signal(signal.SIGSTOP)
    assert beat is not None
    return beat.ts


def test_a_member_frozen_for_2s_is_not_lost_and_costs_no_round(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=1) as job:
        job.start("a", TICKER)
        b = job.start("b", TICKER)
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 2)
        job.wait_event("workers_started", lambda e: e["node"] == "b", since=grown["seq"])
        last_beat = freeze_right_after_a_heartbeat(b)
        time.sleep(max(0.0, last_beat + FREEZE_S - time.time()))  # a slow node, not a dead one: its sockets stay open
        b.signal(signal.SIGCONT)
        b.wait_line(r"\[b:1\] tick=", start=len(b.lines))  # it runs again
        # The coordinator has seen a heartbeat of b from past the loss limit: a false loss would be in the log.
        limit = last_beat + 3 * 1.0  # 3 missed 1 s heartbeats
        wait_until(lambda: any(n["node_id"] == "b" and n["last_seen"] > limit for n in job.status()["nodes"]))
        with job.client() as client:
            events = client.call("events", since_seq=grown["seq"], limit=0)["events"]
        assert [e["kind"] for e in events if e["kind"] in MEMBERSHIP] == []
        status = job.status()
        assert (status["round"], status["world_size"]) == (grown["round"], 2)
        assert [n["status"] for n in status["nodes"]] == ["alive", "alive"]
