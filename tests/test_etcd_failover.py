"""--rdzv-backend etcd with real etcd members: no single node's loss (nor etcd's, for a while) ends the job."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from etcd_cluster import EtcdCluster
from harness import PLAIN, SHIM, TICKER, Job
from system_deps import require_binary

from elasticd.client import ClientError

LEASE_TTL = 2  # seconds: a dead coordinator is replaced within about this long
MEMBERSHIP = ("node_lost", "node_left", "round_started")


@pytest.fixture(scope="module")
def etcd_binary() -> str:
    return require_binary("etcd", "etcd-server")


def etcd_job(tmp: Path, etcd: EtcdCluster, nnodes: str, **kw: Any) -> Job:
    return Job(tmp, nnodes=nnodes, nproc=1, extra=["--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoints,
                                                   "--rdzv-conf", f"lease_ttl={LEASE_TTL}"], **kw)


def ask(job: Job, node: str, op: str, timeout: float = 30.0, **args: Any) -> dict[str, Any]:
    """A request to one daemon; while a coordinator is being replaced, forwarded requests time out: ask again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with job.client(node) as client:
                return client.call(op, **args)
        except ClientError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def wait_event(job: Job, node: str, kind: str, match: Callable[[dict[str, Any]], bool] = lambda e: True,
               since: int = 0, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in ask(job, node, "events", since_seq=since, kinds=[kind], limit=0)["events"]:
            if match(event):
                return event
        time.sleep(0.1)
    raise AssertionError(f"no {kind} after seq {since} at node {node}:\n{job.daemon(node).output()[-3000:]}")


def membership_since(job: Job, node: str, seq: int) -> list[str]:
    return [e["kind"] for e in ask(job, node, "events", since_seq=seq, limit=0)["events"] if e["kind"] in MEMBERSHIP]


def steps(daemon_output: str, node: str) -> list[int]:
    return [int(m) for m in re.findall(rf"\[{node}:0\] step=(\d+) ", daemon_output)]


def test_sigkill_of_the_coordinators_node_a_survivor_takes_over_and_the_job_finishes(tmp_path: Path,
                                                                                     etcd_binary: str) -> None:
    """Also: losing one etcd member (its raft leader) mid-job costs no round."""
    etcd = EtcdCluster(etcd_binary, tmp_path, size=3).start()
    job = etcd_job(tmp_path, etcd, "2:3")
    args = ("--steps", "220", "--snapshot", str(tmp_path / "snapshot.pt"), "--step-time", "0.05")
    try:
        a = job.start("a", PLAIN, *args)
        b = job.start("b", PLAIN, *args)
        c = job.start("c", PLAIN, *args)
        full = wait_event(job, "a", "round_started", lambda e: e["world_size"] == 3)
        order = list(full["rank_map"])  # join order: whose zygote was warm first
        assert order[0] == "a"  # the coordinator's node is rank 0 of the first round
        a.wait_line(rf"\[a:0\] step=\d+ world_size=3")

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
        etcd.restart_all()

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
    finally:
        job.close()
        etcd.close()
        for n, d in job.daemons.items():
            Path(f"/tmp/ft/{n}.log").write_text("\n".join(l for l in d.lines if " step=" not in l))
