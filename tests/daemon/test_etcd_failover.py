"""--rdzv-backend etcd with real etcd members: no single node's loss (nor etcd's, for a while) ends the job."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.etcd_cluster import LEASE_TTL, EtcdCluster, ask, etcd_job, wait_event
from support.harness import PLAIN, SHIM, TICKER, Job, sample_lines, wait_for
from support.system_deps import require_binary

from elasticd.client import ClientError

MEMBERSHIP = ("node_lost", "node_left", "round_started")


@pytest.fixture(scope="module")
def etcd_binary() -> str:
    return require_binary("etcd", "etcd-server")


def membership_since(job: Job, node: str, seq: int) -> list[str]:
    return [e["kind"] for e in ask(job, node, "events", since_seq=seq, limit=0)["events"] if e["kind"] in MEMBERSHIP]


def steps(daemon_output: str, node: str) -> list[int]:
    return [int(m) for m in re.findall(rf"\[{node}:0\] step=(\d+) ", daemon_output)]


def test_sigkill_of_the_coordinators_node_a_survivor_takes_over_and_the_job_finishes(tmp_path: Path,
                                                                                     etcd_binary: str) -> None:
    """Also: losing one etcd member (its raft leader) mid-job costs no round."""
    with (EtcdCluster(etcd_binary, tmp_path, size=3).start() as etcd,
          etcd_job(tmp_path, etcd, "2:3") as job):
        args = ("--steps", "220", "--snapshot", str(tmp_path / "snapshot.pt"), "--step-time", "0.05")
        a = job.start("a", PLAIN, *args)
        b = job.start("b", PLAIN, *args)
        c = job.start("c", PLAIN, *args)
        full = wait_event(job, "a", "round_started", lambda e: e["world_size"] == 3)
        order = list(full["rank_map"])  # join order: whose zygote was warm first
        assert order[0] == "a"  # the coordinator's node is rank 0 of the first round
        a.wait_line(r"\[a:0\] step=\d+ world_size=3")

        # One etcd member gone, the raft leader at that: the job does not notice.
        mark, before = full["seq"], ask(job, "b", "status")
        etcd.kill(etcd.leader())
        seen = len(steps(a.output(), "a"))
        deadline = time.monotonic() + 30
        while len(steps(a.output(), "a")) < seen + 20:  # twenty more steps, with two of three etcd members
            assert time.monotonic() < deadline, a.output()[-2000:]
            time.sleep(0.1)
        assert membership_since(job, "b", mark) == []
        assert ask(job, "b", "status")["restarts"] == before["restarts"]
        etcd.restart()

        # SIGKILL a's daemon and its worker: a survivor is elected, re-forms the world at 2 and training goes on.
        assert (before["coordinator"], before["rdzv_backend"]) == ("a", "etcd")
        a.kill_with_workers()
        smaller = wait_event(job, "c", "round_started", lambda e: e["world_size"] == 2, since=mark)
        assert list(smaller["rank_map"]) == order[1:]  # the survivors keep their order
        first = job.daemon(order[1])
        first.wait_line(rf"\[{order[1]}:0\] step=\d+ world_size=2")
        after = ask(job, "c", "status")
        assert after["coordinator"] in ("b", "c") and after["epoch"] > before["epoch"]
        assert after["restarts"] == {**before["restarts"], "membership": before["restarts"]["membership"] + 1}
        events = ask(job, "c", "events", limit=0)["events"]
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "the job's event log has a gap"
        elected = [e for e in events if e["kind"] == "coordinator_elected"]
        assert [(e["node"], e["previous"]) for e in elected] == [("a", ""), (after["coordinator"], "a")]
        assert [e["kind"] for e in events if e["seq"] > mark and e["kind"] in MEMBERSHIP] == \
            ["node_lost", "round_started"]

        # Both survivors reach the last step and exit 0.
        assert b.wait_exit(120) == 0 and c.wait_exit(30) == 0
        assert steps(first.output(), order[1])[-1] == 220


def ticks(daemon_output: str, node: str) -> int:
    return len(re.findall(rf"\[{node}:\d\] tick=", daemon_output))


def wait_ticks(job: Job, nodes: str, more: int = 10, timeout: float = 30.0) -> None:
    """Every node's worker prints `more` ticks beyond what it had printed so far."""
    start = {n: ticks(job.daemon(n).output(), n) for n in nodes}
    deadline = time.monotonic() + timeout
    while any(ticks(job.daemon(n).output(), n) < start[n] + more for n in nodes):
        assert time.monotonic() < deadline, "a worker stopped ticking"
        time.sleep(0.1)


def test_etcd_away_for_10s_freezes_membership_and_a_stopped_coordinator_is_fenced(tmp_path: Path,
                                                                                  etcd_binary: str) -> None:
    with (EtcdCluster(etcd_binary, tmp_path, size=1).start() as etcd,
          etcd_job(tmp_path, etcd, "2:3") as job):
        a, _b, _c = (job.start(n, TICKER) for n in "abc")
        full = wait_event(job, "b", "round_started", lambda e: e["world_size"] == 3)
        mark = ask(job, "b", "status")["seq"]

        # Every etcd member gone for 10 s: training goes on in the same world, and everyone says why nothing moves.
        etcd.kill_all()
        deadline = time.monotonic() + 10
        wait_for_status(job, "c", lambda s: not s["etcd"]["ok"])
        status = ask(job, "c", "status")
        assert "etcd unreachable" in status["reason"] and "membership frozen" in status["reason"]
        wait_ticks(job, "abc")
        time.sleep(max(0.0, deadline - time.monotonic()))
        for node in "abc":
            assert "etcd unreachable" in job.daemon(node).output()
        # A steer verb now would be lost at a takeover (or undone): refused, through a member as at the coordinator.
        for node in "ca":
            with pytest.raises(ClientError, match=r"etcd lease is not confirmed.*nothing was changed"), \
                    job.client(node) as client:
                client.call("scale", nodes=2)
        ages = {n["node_id"]: n["last_seen_age_s"] for n in ask(job, "c", "status")["nodes"]}
        assert max(ages.values()) < 3, ages  # heartbeats still count: the console shows every node live
        etcd.restart()
        wait_for_status(job, "c", lambda s: s["etcd"]["ok"])
        wait_ticks(job, "abc")
        assert membership_since(job, "b", mark) == []
        status = ask(job, "b", "status")
        assert (status["coordinator"], status["round"], status["restarts"]["membership"]) == \
            ("a", full["round"], full_restarts(full))
        kinds = [e["kind"] for e in ask(job, "b", "events", since_seq=mark, limit=0)["events"]]
        assert "etcd_unreachable" in kinds and "etcd_restored" in kinds

        # The coordinator's daemon SIGSTOPped past its lease: b or c takes over without it; thawed, it issues no
        # round (its lease is gone, its epoch is old) and joins the new coordinator as a member.
        epoch = status["epoch"]
        stopped_at = len(a.lines)
        a.signal(signal.SIGSTOP)
        try:
            smaller = wait_event(job, "b", "round_started", lambda e: e["world_size"] == 2, since=mark)
        finally:
            a.signal(signal.SIGCONT)
        regrown = wait_event(job, "b", "round_started", lambda e: e["world_size"] == 3, since=smaller["seq"])
        a.wait_line(r"no longer the coordinator")
        assert regrown["round"] == smaller["round"] + 1 and "a" in regrown["rank_map"]
        rounds = [e for e in ask(job, "b", "events", since_seq=mark, kinds=["round_started"], limit=0)["events"]]
        assert [e["node"] for e in rounds] == [smaller["node"]] * 2  # every round since is the new coordinator's
        assert not [line for line in a.lines[stopped_at:] if "[a] round_started" in line]  # a decided nothing
        status = ask(job, "a", "status")
        assert status["coordinator"] == smaller["node"] and status["epoch"] > epoch
        wait_ticks(job, "a")


def full_restarts(event: dict[str, Any]) -> int:
    """Membership restarts charged by the rounds up to `event`'s (the first round is the start, not a restart)."""
    return event["round"] - 1


def wait_for_status(job: Job, node: str, condition: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition(ask(job, node, "status")):
        assert time.monotonic() < deadline, "status did not change in time"
        time.sleep(0.2)


def test_sigterm_of_the_coordinators_node_drains_it_and_hands_over_with_no_step_lost(tmp_path: Path,
                                                                                     etcd_binary: str) -> None:
    with (EtcdCluster(etcd_binary, tmp_path, size=1).start() as etcd,
          etcd_job(tmp_path, etcd, "2:3") as job):
        samples = tmp_path / "samples"
        args = ("--steps", "100000", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "0", "--step-time", "0.05",
                "--batch", "24", "--micro", "4", "--sample-log", str(samples))
        a, _b, _c = (job.start(n, SHIM, *args) for n in "abc")
        grown = wait_event(job, "b", "round_started", lambda e: e["world_size"] == 3)
        wait_event(job, "b", "first_step", since=grown["seq"])
        wait_for(lambda: len(sample_lines(samples).get(2, [])) > 5)  # the last rank has trained a few steps
        before = ask(job, "b", "status")
        assert before["coordinator"] == "a"
        a.signal(signal.SIGTERM)
        assert a.wait_exit(30) == 0
        assert "left the job: node a's elasticd received SIGTERM" in a.output()
        shrunk = wait_event(job, "b", "round_started", lambda e: e["world_size"] == 2, since=grown["seq"])
        wait_event(job, "b", "first_step", since=shrunk["seq"])
        wait_for(lambda: any(f"round{shrunk['round']}" in p.name and p.read_text() for p in samples.iterdir()))
        # the next node's rank is rank 0 now: its steps run on from the agreed one, none lost, none repeated.
        steps = [step for step, _ in sample_lines(samples)[0]]
        assert steps == list(range(1, len(steps) + 1)), "a step was lost or repeated across the handover"
        events = ask(job, "b", "events", since_seq=grown["seq"], limit=0)["events"]
        kinds = [e["kind"] for e in events if e["kind"] in ("drain_started", "drain_complete", "node_left",
                                                            "node_lost", "coordinator_elected", "round_started")]
        assert kinds == ["drain_started", "drain_complete", "node_left", "coordinator_elected", "round_started"]
        after = ask(job, "b", "status")
        assert after["coordinator"] in ("b", "c") and after["epoch"] > before["epoch"]
        assert after["restarts"]["failure"] == 0


def test_past_the_outage_limit_without_etcd_the_job_stops_cleanly(tmp_path: Path, etcd_binary: str) -> None:
    """Also: a job id whose last run finished starts afresh (etcd still holds that run's ended state)."""
    with (EtcdCluster(etcd_binary, tmp_path, size=1).start() as etcd,
          Job(tmp_path, nnodes="1:1", nproc=1, extra=["--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoints,
                                                      "--rdzv-conf", "lease_ttl=2,etcd_outage_timeout=2"]) as job):
        assert job.start("a", TICKER, "--ticks", "5").wait_exit(30) == 0
        a = job.start("a", TICKER)  # the same job id again
        a.wait_line(r"\[a:0\] tick=")
        etcd.kill_all()
        assert a.wait_exit(30) == 1
        assert re.search(r"etcd unreachable for \d+s \(--rdzv-conf etcd_outage_timeout=2\): the job stops",
                         a.output()), a.output()[-2000:]
        assert "Traceback" not in a.output()


FREEZES = 5


def freeze_the_coordinator(job: Job, nodes: str, mark: int) -> tuple[str, dict[str, Any]]:
    """SIGSTOP of the coordinator's elasticd for 2 x the lease, then SIGCONT; the round the others formed meanwhile."""
    coordinator = ask(job, nodes[0], "status")["coordinator"]
    other = next(n for n in nodes if n != coordinator)
    frozen = job.daemon(coordinator)
    stopped = time.monotonic()
    frozen.signal(signal.SIGSTOP)
    try:
        smaller = wait_event(job, other, "round_started", lambda e: e["world_size"] == len(nodes) - 1, since=mark)
        time.sleep(max(0.0, stopped + 2 * LEASE_TTL - time.monotonic()))
    finally:
        frozen.signal(signal.SIGCONT)
    return coordinator, smaller


def test_a_coordinator_frozen_past_its_lease_rejoins_as_a_member_five_times_in_a_row(tmp_path: Path,
                                                                                     etcd_binary: str) -> None:
    """A paused VM, a long GC or swap stall: the thawed coordinator steps down and joins the new one as a member,
    however long ago it started (--connect-timeout, here shorter than the test, bounds only a first start)."""
    with (EtcdCluster(etcd_binary, tmp_path, size=3).start() as etcd,
          etcd_job(tmp_path, etcd, "2:4") as job):
        nodes = "abcd"
        for node in nodes:
            job.start(node, TICKER, extra=["--connect-timeout", "5"])
        mark = wait_event(job, "a", "round_started", lambda e: e["world_size"] == 4)["seq"]
        for freeze in range(FREEZES):
            coordinator, smaller = freeze_the_coordinator(job, nodes, mark)
            assert smaller["node"] != coordinator
            regrown = wait_event(job, smaller["node"], "round_started", lambda e: e["world_size"] == 4,
                                 since=smaller["seq"], timeout=30)
            assert coordinator in regrown["rank_map"], f"freeze {freeze}: {coordinator} did not rejoin"
            status = ask(job, coordinator, "status")
            assert status["coordinator"] == regrown["node"] != coordinator
            exited = {n: job.daemon(n).proc.poll() for n in nodes if job.daemon(n).proc.poll() is not None}
            assert not exited, f"freeze {freeze}: daemons exited {exited}"
            wait_ticks(job, nodes)
            mark = regrown["seq"]
        assert "did not answer within" not in "".join(job.daemon(n).output() for n in nodes)
