"""CURVE authentication end to end: keys, roles, revocation, daemons that must hold the node key."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.harness import TICKER, Job

from elasticd.client import Client, ClientError, Credentials
from elasticd.keys.auth import KeyStore


def keys(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "elasticd.cli", "keys", *args], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("auth")
    store = tmp / "keys"
    keys("--dir", str(store), "init")
    keys("--dir", str(store), "create", "ops", "--role", "operator")
    keys("--dir", str(store), "create", "watcher", "--role", "viewer")
    job = Job(tmp, nnodes="1:2", nproc=1, extra=["--keys", str(store)])
    server = str(store / "node" / "node.key")
    job.credentials = Credentials.load(str(store / "clients" / "ops.key_secret"), server)
    job.start("a", TICKER)
    job.start("b", TICKER)
    job.wait_event("round_started", lambda e: e["world_size"] == 2)  # the daemons authenticated each other
    yield job, store, server
    job.close()


def test_a_client_without_keys_gets_nothing(secured) -> None:  # type: ignore[no-untyped-def]
    job, _, _ = secured
    with Client(job.daemons["a"].control, timeout_s=1.5) as plain, pytest.raises(ClientError) as info:
        plain.call("status")
    assert info.value.code == "key_required"  # the handshake failed: nothing reached the daemon


def test_a_viewer_reads_but_cannot_steer_and_the_refusal_is_an_event(secured) -> None:  # type: ignore[no-untyped-def]
    job, store, server = secured
    viewer = Credentials.load(str(store / "clients" / "watcher.key_secret"), server)
    with Client(job.daemons["b"].control, timeout_s=5, credentials=viewer) as client:
        assert client.call("status")["world_size"] == 2
        with pytest.raises(ClientError) as info:
            client.call("drain", node="b")
    assert info.value.code == "unauthorized" and "role viewer" in info.value.reason
    refused = job.wait_event("unauthorized", lambda e: e["op"] == "drain")
    assert refused["by"] == "watcher"
    assert job.status()["world_size"] == 2


def test_an_operator_steers_through_the_cli(secured) -> None:  # type: ignore[no-untyped-def]
    job, store, _ = secured
    result = subprocess.run([sys.executable, "-m", "elasticd.cli", "drain", "b", "--dry-run", "--key",
                             str(store / "clients" / "ops.key_secret")], env=job.env, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr  # the server key came from the daemon's endpoint file
    assert "world 2 → 1" in result.stdout


def test_an_unknown_key_and_a_revoked_key_are_refused(secured, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    job, store, server = secured
    stranger = KeyStore(tmp_path / "other")
    stranger.init()
    foreign = Credentials.load(str(stranger.create_client("eve", "operator")), server)
    with Client(job.daemons["a"].control, timeout_s=1.5, credentials=foreign) as client, \
            pytest.raises(ClientError) as info:
        client.call("status")
    assert info.value.code == "key_refused"
    doomed = Credentials.load(str(KeyStore(store).create_client("temp", "operator")), server)
    client = _connect_when_authorized(job.daemons["a"].control, doomed)
    with client:
        assert client.call("status")["world_size"] == 2
        keys("--dir", str(store), "revoke", "temp")
        # The open connection stays up, but every request is checked against the current keys.
        with pytest.raises(ClientError) as info:
            for _ in range(50):
                client.call("status")
                time.sleep(0.1)
    assert info.value.code == "unauthorized"


def test_a_daemon_without_the_node_key_cannot_join(secured, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    job, _, _ = secured
    other = tmp_path / "otherkeys"
    keys("--dir", str(other), "init")
    intruder = job.start("c", TICKER, extra=["--keys", str(other), "--connect-timeout", "3"])
    assert intruder.wait_exit(30) == 2
    assert "took the connection but never completed the key handshake within 3s" in intruder.output()
    assert f"the job's node key is not the one in --keys {other}" in intruder.output()
    assert [n["node_id"] for n in job.status()["nodes"]] == ["a", "b"]


def _connect_when_authorized(control: str, credentials: Credentials) -> Client:
    """A daemon reads new keys at its next 1 s heartbeat; a handshake refused before that needs a new socket."""
    for _ in range(20):
        client = Client(control, timeout_s=1, credentials=credentials)
        try:
            client.call("hello")
            return client
        except ClientError:
            client.close()
            time.sleep(0.25)  # a refusal is told at once: give the daemon its heartbeat
    raise AssertionError("the new key was never accepted")


def test_the_console_connects_with_a_key_and_sees_nothing_without(secured, capsys) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from tui.cli import resolve
    from tui.session import LiveConnector

    job, store, server = secured
    viewer = Credentials.load(str(store / "clients" / "watcher.key_secret"), server)
    control = job.daemons["a"].control
    jobs, _ = resolve([control], "", viewer)
    assert jobs == {job.job_id: [control]}
    locked_out, _ = resolve([control], "")
    assert job.job_id not in locked_out  # no key: the daemon never answers, the console shows it as missing
    assert f"{control} requires a key" in capsys.readouterr().err  # and says why

    async def status() -> int:
        link = LiveConnector(viewer)(control)
        try:
            return int((await link.call("status"))["world_size"])
        finally:
            link.close()

    assert asyncio.run(status()) == 2


def test_bad_key_commands_and_files_get_one_clear_line(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "elasticd.cli", *args], capture_output=True, text=True,
                              timeout=30, env={"ELASTICD_RUNTIME_DIR": str(tmp_path / "run"), "PATH": "/usr/bin:/bin"})

    store = str(tmp_path / "keys")
    cases = [
        (("keys", "--dir", store, "create", "bad name!"), "key name 'bad name!'"),
        (("keys", "--dir", store, "revoke", "nobody"), "no authorized key named 'nobody'"),
        (("keys", "--dir", store, "authorize", str(tmp_path / "missing.key"), "--name", "x"),
         "cannot read a public key"),
        (("status", "--connect", "tcp://127.0.0.1:9", "--key", str(tmp_path / "missing"), "--server-key",
          "x" * 40), "cannot read key file"),
        (("start", "--standalone", "--keys", str(tmp_path / "empty"), str(TICKER)), "no node key in"),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
    assert run("keys", "--dir", store, "init").returncode == 0
    again = run("keys", "--dir", store, "init")
    assert again.returncode == 2 and "already holds a node key" in again.stderr
