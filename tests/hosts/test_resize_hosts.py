"""In-place resizes across two hosts (network namespaces), with keys and with --insecure: both hosts reach the job's
store, so a join, a drain, a scale and a leave keep the survivors' PIDs; with keys nobody else reaches the store.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import zmq.asyncio
from support.harness import SHIM
from support.netlab import Lab
from support.resizes import ARGS, kept, resized
from support.two_hosts import A, B, TwoHosts, listeners, store_answers

from elasticd.keys.auth import KeyStore
from elasticd.member.processes.spawner import Spawner
from elasticd.member.store.round_store import StoreError, StoreHost
from elasticd.member.store.store_tunnel import JOB_STORE, LOOPBACK, RoundRelay

QUIET_S = 5.0  # how long a stranger's store client is given to hear from the store
READY_S = 20.0  # a store host's start: it says ready once it listens (torch loads at the first client)
JOIN_S = 30.0  # the second host's start to its first step at world 4; a job without its store waited 60 s


@pytest.fixture
def lab() -> Iterator[Lab]:
    with Lab(2) as lab:
        yield lab


@pytest.mark.asyncio
async def test_the_job_store_is_ready_at_once_on_an_address_other_than_loopback(lab: Lab) -> None:
    bridge = f"{lab.subnet}.1"  # the root namespace's address on the lab's bridge
    began = time.monotonic()
    host = await StoreHost.start(Spawner("", None), dict(os.environ), bridge)
    try:
        assert time.monotonic() - began < READY_S
        assert await asyncio.to_thread(store_answers, bridge, host.port)
        listening = psutil.Process(host.proc.pid).net_connections("tcp")
        assert [c.laddr for c in listening if c.status == psutil.CONN_LISTEN] == [(bridge, host.port)]
    finally:
        await host.stop()


@pytest.mark.asyncio
async def test_a_job_store_that_cannot_start_says_so_at_once() -> None:
    began = time.monotonic()
    with pytest.raises(StoreError, match=r"store host on 192\.0\.2\.1 exited before it was ready"):
        await StoreHost.start(Spawner("", None), dict(os.environ), "192.0.2.1")  # no address of this host
    assert time.monotonic() - began < READY_S


def steer(hosts: TwoHosts, *args: str) -> None:
    done = hosts.cli(*args)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("keys", [True, False], ids=["keys", "insecure"])
def test_a_join_drain_scale_and_leave_across_hosts_keep_the_first_hosts_workers(lab: Lab, tmp_path: Path,
                                                                                keys: bool) -> None:
    hosts = TwoHosts(lab, tmp_path, keys=keys, nproc=2, script=SHIM, args=(*ARGS, "--ckpt-dir", str(tmp_path)))
    with hosts.job as job:
        a = hosts.start(A, 0)
        store = a.wait_line(r"job store for in-place resizes at (\S+):(\d+)")
        assert store[1] == (LOOPBACK if keys else lab.addrs[0])  # with keys, only the tunnel leads to it
        a_pids = set(job.wait_event("workers_started", lambda e: e["node"] == A)["pids"])
        job.wait_event("first_step")
        mark, began = job.seq(), time.monotonic()
        b = hosts.start(B, 1)
        grown = resized(job, 4, mark)
        took = time.monotonic() - began
        assert took < JOIN_S, f"world 4 came {took:.1f} s after the second host's start"
        assert kept(job, A, grown) == (a_pids, a_pids)
        if keys:
            assert_strangers_reach_no_job_store(hosts, int(store[2]), tmp_path)
        else:  # what --insecure accepts; and the probe that finds nothing with keys does work
            assert store_answers(lab.addrs[0], int(store[2]))

        mark = job.seq()
        steer(hosts, "drain", B)
        assert kept(job, A, resized(job, 2, mark)) == (a_pids, a_pids)
        mark = job.seq()
        steer(hosts, "scale", "2")  # b is back, in place
        assert kept(job, A, resized(job, 4, mark)) == (a_pids, a_pids)
        mark = job.seq()
        b.signal(signal.SIGTERM)
        assert b.wait_exit(30) == 0
        assert kept(job, A, resized(job, 2, mark)) == (a_pids, a_pids)


def assert_strangers_reach_no_job_store(hosts: TwoHosts, port: int, tmp: Path) -> None:
    """From the third host (the root namespace): not directly, and not through the tunnel with a key of its own."""
    assert {addr for addr, bound, _ in listeners(hosts.lab, 0) if bound == port} == {LOOPBACK}
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((hosts.lab.addrs[0], port), timeout=5).close()
    tunnel = next(n["store_tunnel"] for n in hosts.job.status()["nodes"] if n["node_id"] == A)
    other = KeyStore(tmp / "other")
    other.init()
    assert not asyncio.run(answers_through_tunnel(other, tunnel))


async def answers_through_tunnel(keys: KeyStore, tunnel: str) -> bool:
    """Whether the job store answers a store client whose connections a relay with these keys carries."""
    ctx = zmq.asyncio.Context()
    relay = RoundRelay(ctx, keys.node_keys(), JOB_STORE, tunnel)
    try:
        return await asyncio.wait_for(asyncio.to_thread(store_answers, LOOPBACK, await relay.start()), QUIET_S)
    except asyncio.TimeoutError:  # the client still waits for the store's first reply: closing the relay ends it
        return False
    finally:
        relay.close()
        ctx.destroy(linger=0)
