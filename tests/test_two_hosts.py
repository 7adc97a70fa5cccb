"""Two hosts (network namespaces) with CURVE keys: a plain DDP script trains at world 2 with no *_SOCKET_IFNAME
set by anyone, a node leaves and joins, and the CLI and the console on a third host (the root namespace) see both;
a stranger there reaches no socket of ours without the key, and the job's c10d store only on loopback.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from support.console import SIZE, until
from support.harness import PLAIN, DaemonProc, Job
from support.netlab import Lab

from elasticd.client import Credentials
from elasticd.keys.auth import KeyStore
from tui.app import ElasticApp
from tui.session import LiveConnector

ZMTP_SIGNATURE = b"\xff" + bytes(8) + b"\x7f" + b"\x03"  # ZMTP 3: the peer answers with its whole greeting
WILDCARDS = ("0.0.0.0", "*", "::")
IFNAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
A, B = "gpu-node-017.example.internal", "gpu-node-018.example.internal"  # node ids are hostnames, dots and all


class TwoHosts:
    """Node A on host 0 (it holds the coordinator), node B on host 1: with the job's keys, or `--insecure`."""

    def __init__(self, lab: Lab, tmp: Path, keys: bool = True, nproc: int = 1, script: Path = PLAIN,
                 args: tuple[str, ...] = ()) -> None:
        self.lab, self.tmp, self.script = lab, tmp, script
        self.args = args or ("--steps", "100000", "--snapshot", str(tmp / "snapshot.pt"), "--step-time", "0.05")
        self.job = Job(tmp, nnodes="1:2", nproc=nproc, rdzv_host=lab.addrs[0])
        self.job.env = {k: v for k, v in self.job.env.items() if k not in IFNAMES}
        self.security, self.auth = ["--insecure"], []  # --keys and the credentials of `cli` with keys
        if keys:
            store = KeyStore(tmp / "keys")
            store.init()
            self.key, self.server_key = str(store.create_client("ops", "operator")), str(store.node_dir / "node.key")
            self.job.credentials = Credentials.load(self.key, self.server_key)
            self.security = ["--keys", str(tmp / "keys")]
            self.auth = ["--key", self.key, "--server-key", self.server_key]

    def start(self, node: str, host: int) -> DaemonProc:
        addr = self.lab.addrs[host]
        return self.job.start(node, self.script, *self.args, prefix=self.lab.run_in(host),
                              extra=[*self.security, "--control", f"tcp://{addr}:*", "--pub", f"tcp://{addr}:*"])

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """An `elasticd` verb run on the third host, the root namespace, against node a."""
        return subprocess.run([sys.executable, "-m", "elasticd.cli", *args, "--connect", self.job.daemon(A).control,
                               *self.auth], env=self.job.env, capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoHosts]:
    with Lab(2) as lab:
        two = TwoHosts(lab, tmp_path_factory.mktemp("hosts"))
        try:
            two.start(A, 0)
            two.job.wait_event("round_started")
            two.start(B, 1)
            two.job.wait_event("round_started", lambda e: e["world_size"] == 2)
            yield two
        finally:
            two.job.close()


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


def listeners(lab: Lab, host: int) -> list[tuple[str, int, set[int]]]:
    """Every listening TCP socket on that host: (address, port, owner pids)."""
    out = subprocess.run([*lab.run_in(host), "ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        addr, _, port = line.split()[3].rpartition(":")
        found.append((addr.strip("[]"), int(port), {int(p) for p in re.findall(r"pid=(\d+)", line)}))
    return found


def zmtp_mechanism(addr: str, port: int) -> bytes:
    """The security mechanism a ZeroMQ socket announces in its greeting (ours stops short of naming one)."""
    with socket.create_connection((addr, port), timeout=5) as conn:
        conn.sendall(ZMTP_SIGNATURE)
        greeting = b""
        while len(greeting) < 64 and (chunk := conn.recv(64 - len(greeting))):
            greeting += chunk
    return greeting[12:32].rstrip(b"\0")


def store_answers(addr: str, port: int) -> bool:
    """Whether a c10d store client from here can write and read a key there."""
    from torch.distributed import TCPStore

    try:
        store = TCPStore(addr, port, None, is_master=False, timeout=timedelta(seconds=3))
        store.set("stranger", "was here")
        return store.get("stranger") == b"was here"
    except Exception:  # refused, reset, or timed out: what a stranger should get
        return False


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
