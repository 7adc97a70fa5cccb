"""Telling a dead coordinator from a cut-off one (--rdzv-backend etcd, three hosts in network namespaces).

A SIGKILLed coordinator's host refuses its port: its lease is revoked and the next daemon leads long before the lease
would run out. A coordinator whose link is down answers nothing: it is replaced only once its lease expires, it
decides nothing meanwhile, and when the link is back it joins the new coordinator as a member.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.etcd_cluster import EtcdCluster, ask, wait_event
from support.harness import TICKER, Job, wait_for
from support.netlab import Lab, ip
from support.system_deps import require_binary

NODES = "abc"  # node i on host i; a is started first and leads
REVOKED = "revoking its etcd lease"
DECLINED = "coordinator a's link dropped but"


class Hosts:
    """Three hosts, etcd on the bridge (the root namespace), a daemon of one job on each host."""

    def __init__(self, lab: Lab, tmp: Path, etcd_binary: str, lease_ttl: int) -> None:
        self.lab = lab
        self.mark = 0
        self.etcd = EtcdCluster(etcd_binary, tmp, size=1, host=lab.subnet + ".1").start()
        self.job = Job(tmp, nnodes="2:3", nproc=1, rdzv_host=lab.addrs[0],
                       extra=["--insecure", "--rdzv-backend", "etcd", "--rdzv-endpoint", self.etcd.endpoints,
                              "--rdzv-conf", f"lease_ttl={lease_ttl}"])

    def start(self) -> int:
        """The seq of the round at world 3 (one the job's log in etcd holds: later ones may renumber at a takeover)."""
        for host, node in enumerate(NODES):
            addr = self.lab.addrs[host]
            self.job.start(node, TICKER, prefix=self.lab.run_in(host),
                           extra=["--control", f"tcp://{addr}:*", "--pub", f"tcp://{addr}:*"])
            if node == "a":
                wait_for(lambda: ask(self.job, "a", "status")["coordinator"] == "a")
        return int(wait_event(self.job, "a", "round_started", lambda e: e["world_size"] == 3)["seq"])

    def link(self, host: int, state: str) -> None:
        ip(f"netns exec {self.lab.names[host]} ip link set {self.lab.links[host]} {state}")

    def close(self) -> None:
        self.job.close()
        self.etcd.close()


@pytest.fixture
def hosts(tmp_path: Path, etcd_binary: str, request: pytest.FixtureRequest) -> Iterator[Hosts]:
    with Lab(3) as lab:
        three = Hosts(lab, tmp_path, etcd_binary, request.param)
        try:
            three.mark = three.start()
            yield three
        finally:
            three.close()


@pytest.fixture(scope="module")
def etcd_binary() -> str:
    return require_binary("etcd", "etcd-server")


@pytest.mark.parametrize("hosts", [30], indirect=True)  # a lease no test waits for
def test_a_sigkilled_coordinator_is_replaced_long_before_its_lease_runs_out(hosts: Hosts) -> None:
    job = hosts.job
    mark = hosts.mark
    killed = time.monotonic()
    job.daemon("a").kill_with_workers()
    elected = wait_event(job, "b", "coordinator_elected", since=mark, timeout=20)
    assert time.monotonic() - killed < 20  # the 30 s lease did not run out: a survivor revoked it
    assert elected["previous"] == "a" and elected["node"] in ("b", "c")
    assert REVOKED in job.daemon("b").output() + job.daemon("c").output()
    smaller = wait_event(job, "b", "round_started", lambda e: e["world_size"] == 2, since=mark)
    assert sorted(smaller["rank_map"]) == ["b", "c"]


# The lease lapses 2/3 to all of it after the cut (kept alive every third); ZeroMQ's heartbeat drops the links after 3 s
# and the probe answers within 1.2 s: with 10 s, the members' probes certainly come before the election.
@pytest.mark.parametrize("hosts", [10], indirect=True)
def test_a_coordinator_cut_off_by_the_network_is_replaced_only_after_its_lease(hosts: Hosts) -> None:
    job, a = hosts.job, hosts.job.daemon("a")
    mark = hosts.mark
    epoch = ask(job, "b", "status")["epoch"]
    hosts.link(0, "down")
    try:
        # The members' links to a drop; a's port does not refuse (nothing answers): they wait for its lease.
        wait_for(lambda: all(DECLINED in job.daemon(node).output() for node in "bc"), timeout=30)
        elected = wait_event(job, "b", "coordinator_elected", since=mark, timeout=30)
    finally:
        hosts.link(0, "up")
    assert elected["epoch"] > epoch and elected["node"] in ("b", "c")
    assert REVOKED not in job.daemon("b").output() + job.daemon("c").output()
    a.wait_line(r"no longer the coordinator", timeout=30)
    regrown = wait_event(job, "b", "round_started", lambda e: e["world_size"] == 3, since=elected["seq"], timeout=60)
    assert "a" in regrown["rank_map"]
    # Every round the job's log holds since the cut is the new coordinator's: a's decisions while cut off (in its
    # own, older epoch, until its lease lapsed) reached no one.
    rounds = ask(job, "b", "events", since_seq=mark, kinds=["round_started"], limit=0)["events"]
    assert {e["node"] for e in rounds} == {elected["node"]}
    assert ask(job, "a", "status")["coordinator"] == elected["node"]
