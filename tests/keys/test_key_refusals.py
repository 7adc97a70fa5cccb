"""A refused key is said at once by the client and recorded, rate-limited, by the daemon that refused it."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import zmq
import zmq.auth
from support.harness import TICKER, Job
from support.netlab import Lab

from elasticd.client import AsyncClient, Client, ClientError, Credentials
from elasticd.keys.auth import KeyStore
from elasticd.keys.refusals import MAX_REPORTS_PER_WINDOW, REPORT_WINDOW_S, RefusalLog
from elasticd.keys.tcp_closed import ADDRESSES, HEADER, Closed, parse

BURST = 50
SOCK_DIAG_BY_FAMILY = 20  # the netlink message type of the kernel's news
PROMPT_S = 10  # a refused call must end long before the --timeout 30 it was given


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("refusals")
    store = KeyStore(tmp / "keys")
    store.init()
    ops = store.create_client("ops", "operator")
    stranger = KeyStore(tmp / "stranger")
    stranger.init()
    eve = stranger.create_client("eve", "operator")  # a key this job never issued
    job = Job(tmp, nnodes="1:1", nproc=1, extra=["--keys", str(store.root)])
    server = str(store.node_dir / "node.key")
    job.credentials = Credentials.load(str(ops), server)
    job.start("a", TICKER)
    job.wait_event("round_started")
    yield job, server, ops, eve
    job.close()


def cli(job: Job, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elasticd.cli", *args, "--connect", job.daemons["a"].control,
                           "--timeout", "30"], env=job.env, capture_output=True, text=True, timeout=PROMPT_S)


def fingerprint_of(key_file: Path) -> str:
    return zmq.auth.load_certificate(str(key_file))[0].decode()[:8]


def test_an_unknown_key_is_refused_at_once_and_the_refusal_is_an_event(keyed) -> None:  # type: ignore[no-untyped-def]
    job, server, ops, eve = keyed
    control = job.daemons["a"].control
    result = cli(job, "status", "--key", str(eve), "--server-key", server)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"elasticd status: {control} refused our key (not authorized for this job; ask an operator for one: "
        "elasticd keys create NAME) [key_refused]"]
    event = job.wait_event("key_refused", lambda e: e["key"] == fingerprint_of(eve))
    assert (event["peer"], event["domain"], event["node"]) == ("127.0.0.1", "control", "a")
    assert f"refused key {fingerprint_of(eve)} from 127.0.0.1 on control (Unknown key)" in job.daemons["a"].output()
    shown = cli(job, "events", "--kind", "key_refused", "--key", str(ops), "--server-key", server)
    assert shown.returncode == 0, shown.stderr
    assert f"key_refused refused key {fingerprint_of(eve)} from 127.0.0.1 on control (Unknown key" in shown.stdout
    assert "refused our key" not in shown.stderr


def test_no_key_against_a_keyed_daemon_says_a_key_is_needed(keyed) -> None:  # type: ignore[no-untyped-def]
    job, _, _, _ = keyed
    result = cli(job, "status")
    assert result.returncode == 1
    assert f"{job.daemons['a'].control} requires a key" in result.stderr and "--key FILE" in result.stderr
    assert "[key_required]" in result.stderr and "Traceback" not in result.stderr


def test_a_burst_of_refusals_yields_a_bounded_number_of_events(keyed) -> None:  # type: ignore[no-untyped-def]
    job, server, _, _ = keyed
    flooder = KeyStore(job.tmp / "flood")
    flooder.init()
    key = flooder.create_client("mallory", "operator")
    before = int(job.status()["refused_keys"])
    for _ in range(BURST):
        with Client(job.daemons["a"].control, timeout_s=30, credentials=Credentials.load(str(key), server)) as c, \
                pytest.raises(ClientError) as info:
            c.call("hello")
        assert info.value.code == "key_refused"
    status = job.status()  # the daemon took the flood and still answers
    assert status["refused_keys"] - before == BURST and status["state"] == "running"
    with job.client() as client:
        reports = client.call("events", kinds=["key_refused"], limit=0)["events"]
    mine = [e for e in reports if e["key"] == fingerprint_of(key)]
    assert 1 <= len(mine) <= 2, mine  # one per window; a second only if the burst straddled the window's end


def test_the_console_client_is_told_at_once_too(keyed) -> None:  # type: ignore[no-untyped-def]
    job, server, _, eve = keyed

    async def call() -> ClientError:
        client = AsyncClient(job.daemons["a"].control, timeout_s=30, credentials=Credentials.load(str(eve), server))
        try:
            with pytest.raises(ClientError) as info:
                await asyncio.wait_for(client.call("status"), PROMPT_S)
            return info.value
        finally:
            client.close()

    error = asyncio.run(call())
    assert error.code == "key_refused" and "refused our key" in error.reason


def test_a_key_against_a_daemon_without_keys_says_so(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys")
    store.init()
    credentials = Credentials.load(str(store.create_client("ops", "operator")), str(store.node_dir / "node.key"))
    plain = zmq.Context.instance().socket(zmq.ROUTER)  # what a daemon started without --keys binds
    port = plain.bind_to_random_port("tcp://127.0.0.1")
    started = time.monotonic()
    try:
        with Client(f"tcp://127.0.0.1:{port}", timeout_s=30, credentials=credentials) as client, \
                pytest.raises(ClientError) as info:
            client.call("hello")
    finally:
        plain.close(0)
    assert info.value.code == "key_mismatch" and "drop --key" in info.value.reason
    assert time.monotonic() - started < PROMPT_S


def test_refusals_are_reported_once_per_peer_and_window_and_capped_overall() -> None:
    log = RefusalLog()
    reports = [log.record("control", "10.0.0.9", "abcdefgh", now=float(i) / BURST) for i in range(BURST)]
    assert reports[0] == 0 and reports[1:] == [None] * (BURST - 1)
    assert log.record("control", "10.0.0.9", "abcdefgh", now=REPORT_WINDOW_S + 1) == BURST - 1
    assert log.record("mesh", "10.0.0.9", "abcdefgh", now=REPORT_WINDOW_S + 1) == 0  # another domain: its own
    fresh = [log.record("control", "10.0.0.7", f"key{i:05d}", now=100.0) for i in range(1000)]
    assert sum(r is not None for r in fresh) == MAX_REPORTS_PER_WINDOW  # fresh keys cannot flood the log
    assert log.total == BURST + 2 + 1000 and log.by_domain["mesh"] == 1


def test_the_kernels_news_of_closed_sockets_is_read_whatever_its_bytes() -> None:
    news = HEADER.pack(HEADER.size + ADDRESSES.size, SOCK_DIAG_BY_FAMILY, 0, 0, 0) + ADDRESSES.pack(
        socket.AF_INET, 7, 0, 0, 29600, 40000, socket.inet_aton("10.0.0.1"), socket.inet_aton("10.0.0.9"))
    closed = Closed(port=29600, ip="10.0.0.9", peer_port=40000)
    assert parse(news) == [closed] and parse(news * 3) == [closed] * 3
    assert [parse(news[:cut]) for cut in range(len(news))] == [[]] * len(news)  # a truncated message is no socket
    rng = random.Random(24)
    for size in range(200):
        parse(rng.randbytes(size))  # never raises


# ---- connections refused before the authenticator is asked: no key, not CURVE, not ZeroMQ at all --------------------
FLOOD = 1000
FLOOD_RATE = 100  # attempts a second: 1,000 in about 10 s
RECORDED_S = 2.0  # a refusal is an event this soon
ANSWER_S = 5.0  # a status call with the right key during the flood: usually milliseconds, generous for a loaded box
NULL_GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)  # ZMTP 3.0, no key
FLOODER = """
import socket, sys, time
host, port, count, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
greeting = bytes.fromhex(sys.argv[5])
start = time.monotonic()
for i in range(count):
    time.sleep(max(0.0, start + i / rate - time.monotonic()))
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(greeting)
        try:
            while s.recv(4096):  # until the daemon hangs up: every attempt reaches its verdict
                pass
        except OSError:
            pass
"""


class LabJob(NamedTuple):
    lab: Lab
    job: Job
    key: str  # an operator's key file
    server: str

    @property
    def third_host(self) -> str:
        """The root namespace's address on the lab's bridge: where the test process itself connects from."""
        return f"{self.lab.subnet}.1"

    @property
    def control(self) -> tuple[str, int]:
        return self.lab.addrs[0], int(self.job.daemons["a"].control.rpartition(":")[2])

    def status_cli(self, *prefix: str, keyed: bool = True) -> subprocess.CompletedProcess[str]:
        """The real `elasticd status`, from this host or through `prefix` (another host)."""
        key = ["--key", self.key, "--server-key", self.server] if keyed else []
        return subprocess.run([*prefix, sys.executable, "-m", "elasticd.cli", "status", "--connect",
                               self.job.daemons["a"].control, "--timeout", "30", *key], env=self.job.env,
                              capture_output=True, text=True, timeout=PROMPT_S)


@pytest.fixture(scope="module")
def lab_keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabJob]:
    """A keyed daemon on host 0 of a network lab; host 1 and the root namespace are other hosts."""
    tmp = tmp_path_factory.mktemp("refusals-lab")
    store = KeyStore(tmp / "keys")
    store.init()
    key, server = str(store.create_client("ops", "operator")), str(store.node_dir / "node.key")
    with Lab(2) as lab:
        addr = lab.addrs[0]
        with Job(tmp, nnodes="1:1", nproc=1, rdzv_host=addr,
                 extra=["--keys", str(store.root), "--control", f"tcp://{addr}:*", "--pub", f"tcp://{addr}:*"]) as job:
            job.credentials = Credentials.load(key, server)
            job.start("a", TICKER, prefix=lab.run_in(0))
            job.wait_event("round_started")
            yield LabJob(lab, job, key, server)


def test_a_keyless_status_from_another_host_is_recorded_with_its_address(lab_keyed: LabJob) -> None:
    lab, job = lab_keyed.lab, lab_keyed.job
    since = job.seq()
    result = lab_keyed.status_cli(*lab.run_in(1), keyed=False)
    assert result.returncode == 1 and f"{job.daemons['a'].control} requires a key" in result.stderr
    event = job.wait_event("key_refused", lambda e: e["peer"] == lab.addrs[1], since=since, timeout=RECORDED_S)
    assert (event["domain"], event["key"], event["node"]) == ("control", "-", "a")
    assert event["stage"] in ("mechanism", "handshake")  # whichever side reads the other's greeting first hangs up
    job.daemons["a"].wait_line(rf"refused a connection from {re.escape(lab.addrs[1])} on control \(", timeout=5)


def test_a_plain_zeromq_peer_and_a_web_request_are_recorded(lab_keyed: LabJob) -> None:
    lab, job = lab_keyed.lab, lab_keyed.job
    since = job.seq()
    plain = zmq.Context.instance().socket(zmq.DEALER)  # no key: the NULL mechanism, on the daemon-to-daemon mesh
    plain.connect(f"tcp://{lab.addrs[0]}:{job.port}")
    try:
        null = job.wait_event("key_refused", lambda e: e["domain"] == "mesh", since=since, timeout=RECORDED_S)
    finally:
        plain.close(0)
    assert (null["peer"], null["key"]) == (lab_keyed.third_host, "-")
    with socket.create_connection(lab_keyed.control) as web:
        web.sendall(b"GET / HTTP/1.0\r\n\r\n")  # at once: the daemon resets it with its bytes unread
        with contextlib.suppress(OSError):
            while web.recv(4096):
                pass
    http = job.wait_event("key_refused", lambda e: e["stage"] == "greeting", since=since, timeout=RECORDED_S)
    assert (http["domain"], http["peer"]) == ("control", lab_keyed.third_host)
    assert "not a ZeroMQ greeting" in http["reason"]


def test_a_flood_of_keyless_connections_leaves_few_events_and_status_still_answers(lab_keyed: LabJob) -> None:
    job = lab_keyed.job
    before, since = int(job.status()["refused_keys"]), job.seq()
    started = time.monotonic()
    flood = subprocess.Popen([sys.executable, "-c", FLOODER, *map(str, lab_keyed.control), str(FLOOD),
                              str(FLOOD_RATE), NULL_GREETING.hex()])
    answers: list[float] = []
    cli: subprocess.CompletedProcess[str] | None = None
    try:
        while flood.poll() is None:
            asked = time.monotonic()
            assert job.status()["state"] == "running"
            answers.append(time.monotonic() - asked)
            if cli is None and asked - started > FLOOD / FLOOD_RATE / 2:
                cli = lab_keyed.status_cli()  # the real CLI, halfway through
        assert flood.wait() == 0
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait()
    spent = time.monotonic() - started
    assert len(answers) >= 5 and max(answers) < ANSWER_S, answers  # control answered throughout the flood
    assert cli is not None and cli.returncode == 0 and "running" in cli.stdout, cli
    assert job.status()["refused_keys"] - before == FLOOD  # every attempt counted
    with job.client() as client:
        events = client.call("events", since_seq=since, kinds=["key_refused"], limit=0)["events"]
    assert 1 <= len(events) <= 1 + math.ceil(spent / REPORT_WINDOW_S), events  # one a window from the one peer
    assert {e["peer"] for e in events} == {lab_keyed.third_host}
