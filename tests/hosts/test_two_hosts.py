"""Two hosts (network namespaces) with CURVE keys: a plain DDP script trains at world 2 with no *_SOCKET_IFNAME
set by anyone, a node leaves and joins, and the CLI and the console on a third host (the root namespace) see both;
a stranger there reaches no socket of ours without the key, and the job's c10d store only on loopback.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest
from support.console import SIZE, until
from support.harness import DaemonProc
from support.netlab import Lab
from support.two_hosts import IFNAMES, A, B, TwoHosts, listeners, store_answers

from elasticd.client import Credentials
from tui.app import ElasticApp
from tui.session import LiveConnector

ZMTP_SIGNATURE = b"\xff" + bytes(8) + b"\x7f" + b"\x03"  # ZMTP 3: the peer answers with its whole greeting
WILDCARDS = ("0.0.0.0", "*", "::")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoHosts]:
    with Lab(2) as lab:
        two = TwoHosts(lab, tmp_path_factory.mktemp("hosts"))
        with two.job:
            two.start(A, 0)
            two.job.wait_event("round_started")
            two.start(B, 1)
            two.job.wait_event("round_started", lambda e: e["world_size"] == 2)
            yield two


def test_plain_ddp_trains_across_two_hosts_on_the_interface_of_the_advertised_address(hosts: TwoHosts) -> None:
    assert not any(name in os.environ for name in IFNAMES)  # nobody set them: the daemons chose
    a, b = hosts.job.daemon(A), hosts.job.daemon(B)
    a.wait_line(r"step=\d+ world_size=2 ")  # gloo's full mesh formed across the two hosts
    assert "connectFullMesh failed" not in a.output() + b.output()
    for daemon, link in ((a, hosts.lab.links[0]), (b, hosts.lab.links[1])):
        daemon.wait_line(rf"interface {link}\b")
    status = hosts.job.status()
    assert status["restarts"]["failure"] == 0
    assert {n["node_id"]: n["host"] for n in status["nodes"]} == dict(zip((A, B), hosts.lab.addrs, strict=True))


def test_status_from_a_third_host_sees_both_nodes(hosts: TwoHosts) -> None:
    status = hosts.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    reply = json.loads(status.stdout)
    assert reply["world_size"] == 2 and [n["node_id"] for n in reply["nodes"]] == [A, B]
    assert A in hosts.cli("status").stdout  # the full id, not the first label
    keyless = subprocess.run([sys.executable, "-m", "elasticd.cli", "status", "--connect",
                              hosts.job.daemon(A).control, "--timeout", "2"],
                             env=hosts.job.env, capture_output=True, text=True, timeout=30)
    assert keyless.returncode != 0 and "Traceback" not in keyless.stderr  # a stranger gets nothing


def zmtp_mechanism(addr: str, port: int) -> bytes:
    """The security mechanism a ZeroMQ socket announces in its greeting (ours stops short of naming one)."""
    with socket.create_connection((addr, port), timeout=5) as conn:
        conn.sendall(ZMTP_SIGNATURE)
        greeting = b""
        while len(greeting) < 64 and (chunk := conn.recv(64 - len(greeting))):
            greeting += chunk
    return greeting[12:32].rstrip(b"\0")


def ours(daemon: DaemonProc, workers: set[int]) -> dict[int, str]:
    """The daemon, its zygote and its store host (pid -> command line); workers are torch's, not ours."""
    tree = psutil.Process(daemon.proc.pid)
    procs = [tree, *tree.children(recursive=True)]
    return {p.pid: " ".join(p.cmdline()) for p in procs if p.pid not in workers and p.ppid() not in workers}


def test_a_stranger_on_a_third_host_reaches_no_store_and_no_socket_of_ours(hosts: TwoHosts) -> None:
    hosts.job.daemon(A).wait_line(r"step=\d+ world_size=2 ")
    workers = hosts.job.worker_pids()
    store_hosts: dict[str, list[int]] = {}
    found = [listeners(hosts.lab, host) for host in (0, 1)]
    for host, node in enumerate((A, B)):
        mine = ours(hosts.job.daemon(node), workers)
        store_hosts[node] = [pid for pid, cmd in mine.items() if "elasticd.member.store.store_host" in cmd]
        exposed = [(addr, port) for addr, port, pids in found[host]
                   if not addr.startswith("127.") and pids & mine.keys()]
        assert len(exposed) >= 3, exposed  # control, pub and the store tunnel at least
        for addr, port in exposed:
            assert zmtp_mechanism(addr, port) == b"CURVE", (node, addr, port)
            assert not store_answers(addr, port), (node, addr, port)
    # Rank 0 no longer hosts a store on every interface: workers listen only on their interface (gloo).
    assert [entry for entries in found for entry in entries if entry[0] in WILDCARDS] == []
    # Both on node a: the round's store (a holds rank 0) and the job's store for in-place resizes (a coordinates).
    assert (len(store_hosts[A]), store_hosts[B]) == (2, [])
    for pid in store_hosts[A]:
        assert [addr for entries in found for addr, _, pids in entries if pid in pids] == ["127.0.0.1"]


@pytest.mark.asyncio
async def test_console_from_a_third_host_sees_both_nodes_live(hosts: TwoHosts) -> None:
    creds = Credentials.load(hosts.key, hosts.server_key)
    app = ElasticApp({hosts.job.job_id: [hosts.job.daemon(B).control]}, connect=LiveConnector(creds))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: set(app.model.nodes) == {A, B} and app.model.job.world_size == 2
                    and all(app.model.node_liveness(n) == "live" for n in app.model.nodes.values()),
                    what="both hosts' daemons live in the console")


def test_a_node_leaves_and_joins_again(hosts: TwoHosts) -> None:
    job, a, b = hosts.job, hosts.job.daemon(A), hosts.job.daemon(B)
    mark = job.seq()
    b.signal(signal.SIGTERM)
    assert b.wait_exit(30) == 0
    shrunk = job.wait_event("round_started", lambda e: e["world_size"] == 1, since=mark)
    a.wait_line(r"step=\d+ world_size=1 ", start=len(a.lines))
    hosts.start(B, 1)
    job.wait_event("round_started", lambda e: e["world_size"] == 2, since=shrunk["seq"])
    a.wait_line(r"step=\d+ world_size=2 ", start=len(a.lines))
    assert job.status()["restarts"]["failure"] == 0
