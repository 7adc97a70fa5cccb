"""A refused key is said at once by the client and recorded, rate-limited, by the daemon that refused it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
import zmq.auth
from harness import TICKER, Job

from elasticd.auth import KeyStore
from elasticd.client import AsyncClient, Client, ClientError, Credentials
from elasticd.refusals import MAX_REPORTS_PER_WINDOW, REPORT_WINDOW_S, RefusalLog

BURST = 50
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
    assert "key_refused" in shown.stdout and "peer=127.0.0.1" in shown.stdout
    assert f"key={fingerprint_of(eve)}" in shown.stdout
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
