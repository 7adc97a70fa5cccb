"""Real daemons of a job with relays (a small job told to have them, as one of 256 nodes has): the members send
through relays, a relay's SIGKILL costs the job that one node, and a member dying behind a relay is noticed by
its closed link."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from support.harness import TICKER, Job, secure

NODES = "abcdef"  # a coordinates; groups of 2: two relays with two members each and one of one, or so


def relayed(job: Job) -> dict[str, list[str]]:
    """relay -> its members, from `status`."""
    groups: dict[str, list[str]] = {}
    for node in job.status()["nodes"]:
        if node["status"] == "alive" and node["via"]:
            groups.setdefault(node["via"], []).append(node["node_id"])
    return groups


def wait_for(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.2)
    return found


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_members_send_through_relays_and_a_relays_sigkill_costs_only_that_node(tmp_path: Path, curve: bool) -> None:
    with Job(tmp_path, nnodes=f"3:{len(NODES)}", nproc=1, extra=["--rdzv-conf", "relay_group=2,relay_from=2"]) as job:
        if curve:
            secure(job)
        for node in NODES:
            job.start(node, TICKER)
        # Not the first round: on a loaded host the last daemon may announce itself after the others formed one.
        full = job.wait_event("round_started", lambda e: e["world_size"] == len(NODES))
        formed = job.wait_event("round_complete", lambda e: e["round"] == full["round"])
        assert job.status()["world_size"] == len(NODES)
        groups = wait_for(lambda: relayed(job) if sum(map(len, relayed(job).values())) >= 2 else None)
        relay, members = next(iter(groups.items()))
        job.daemons[members[0]].wait_line(r"now sends through tcp://")  # it took its relay's link
        job.daemon(relay).kill_with_workers()
        lost = job.wait_event("node_lost", lambda e: e["node"] == relay, since=formed["seq"])
        # Its closed connection names it at once; under a loaded suite the close is sometimes not heard (with keys,
        # the kernel's feed of freed sockets can overflow) and the heartbeat names it 3 s later: lost either way.
        assert lost["reason"] in (f"node {relay}'s connection closed", f"node {relay} missed 3 heartbeats")
        replaced = job.wait_event("relay_replaced", lambda e: e["node"] == relay, since=formed["seq"])
        assert replaced["relay"] in members
        smaller = job.wait_event("round_complete", lambda e: True, since=lost["seq"])
        assert job.status()["world_size"] == len(NODES) - 1
        time.sleep(4.0)  # past the loss limit: its group would be lost by now if its frames were
        with job.client() as client:
            events = client.call("events", since_seq=formed["seq"], kinds=["node_lost"], limit=0)["events"]
        assert [e["node"] for e in events] == [relay]
        for member in members:
            job.daemons[member].wait_line(rf"\[{member}:\d+\] tick=\d+ rank=\d+ world={len(NODES) - 1}")

        # A member that took its relay's link at the start (of a group the loss did not move), if there is one.
        groups = relayed(job)
        behind = next((ms[0] for r, ms in groups.items() if r != replaced["relay"]), "") or groups[replaced["relay"]][0]
        job.daemons[behind].wait_line(r"now sends through tcp://")
        job.daemon(behind).kill_with_workers()
        lost = job.wait_event("node_lost", lambda e: e["node"] == behind, since=smaller["seq"])
        assert lost["reason"] == f"node {behind}'s connection closed"  # its relay saw the link close
