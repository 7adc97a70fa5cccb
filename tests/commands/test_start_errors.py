"""`elasticd start` with bad input: a clear one-line error and exit code 2, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.harness import TICKER, free_port


def start(tmp: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    # A job that runs waits for its zygote to import torch first: 3 s here, 20 s on a loaded 2-core CI machine.
    env = {"ELASTICD_RUNTIME_DIR": str(tmp / "run"), "PATH": "/usr/bin:/bin",
           **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}  # a worktree on PYTHONPATH tests itself
    return subprocess.run([sys.executable, "-m", "elasticd.cli", "start", *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(("args", "message"), [
    (["--nnodes", "2:1", str(TICKER)], "need 1 <= MIN <= MAX"),
    (["--nnodes", "x", str(TICKER)], "--nnodes must be N or MIN:MAX"),
    (["--nproc-per-node", "0", str(TICKER)], "--nproc-per-node must be a positive integer"),
    (["--nnodes", "1:2", str(TICKER)], "--rdzv-endpoint HOST:PORT is required"),
    (["--rdzv-endpoint", "127.0.0.1:99999", str(TICKER)], "port in 1..65535"),
    (["--standalone", "--nnodes", "2", str(TICKER)], "--standalone is a single-node job"),
    (["--standalone", "no_such_script.py"], "training script 'no_such_script.py' does not exist"),
    (["--standalone", "--node-id", "bad id!", str(TICKER)], "--node-id 'bad id!': use a hostname"),
    (["--standalone", "--node-id", "a..b", str(TICKER)], "--node-id 'a..b': use a hostname"),
    (["--standalone", "--node-id", "x" * 254, str(TICKER)], "253 characters at most"),
    (["--standalone", "--rdzv-id", "job.1", str(TICKER)], "--rdzv-id 'job.1': use 1-63 letters"),
    (["--standalone", "--grace-period", "-1", str(TICKER)], "--grace-period must be positive"),
    (["--standalone", "--metrics-from-output", "step=(\\d+", str(TICKER)], "is not a regular expression"),
    (["--standalone", "--metrics-from-output", "step=(\\d+)", str(TICKER)], "names no (?P<step>...)"),
    (["--standalone", "--max_restarts", "-2", str(TICKER)], "--max-restarts must be 0 or more"),
    (["--standalone", "--port-range", "9000", str(TICKER)], "--port-range must be LOW-HIGH"),
    (["--standalone", "--port-range", "9001-9000", str(TICKER)], "--port-range must be LOW-HIGH"),
    (["--standalone", "--port-range", "0-10", str(TICKER)], "1 <= LOW <= HIGH <= 65535"),
    (["--standalone", "--port-range", "9000-70000", str(TICKER)], "1 <= LOW <= HIGH <= 65535"),
    (["--standalone", "--metrics-port", "x", str(TICKER)], "--metrics-port must be a port in 0..65535"),
    (["--standalone", "--metrics-port", "70000", str(TICKER)], "--metrics-port must be a port in 0..65535"),
    (["--standalone", "--on-event", "node_gone:true", str(TICKER)], "--on-event: no event kind node_gone; kinds:"),
    (["--standalone", "--alert-goodput-below", "90", str(TICKER)], "--alert-goodput-below must be a share in [0, 1)"),
    (["--standalone", "--alert-goodput-below", "nan", str(TICKER)], "--alert-goodput-below must be a share"),
    (["--standalone", "--alert-goodput-window", "0", str(TICKER)], "--alert-goodput-window must be in (0, 3600]"),
    (["--standalone", "--alert-checkpoint-age", "-5", str(TICKER)], "--alert-checkpoint-age must be 0 (never)"),
    (["--standalone", "--alert-checkpoint-age", "soon", str(TICKER)], "seconds, got 'soon'"),
])
def test_bad_flags_get_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = start(tmp_path, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_control_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = start(tmp_path, "--standalone", "--control", f"tcp://127.0.0.1:{port}", str(TICKER))
    assert result.returncode == 2
    assert f"tcp://127.0.0.1:{port}" in result.stderr and "in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_metrics_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = start(tmp_path, "--standalone", "--metrics-port", str(port), str(TICKER))
    assert result.returncode == 2
    assert result.stderr.strip() == f"elasticd start: cannot bind --metrics-port {port} on 127.0.0.1: address in use"


def test_unreachable_endpoint_gives_up_with_a_reason(tmp_path: Path) -> None:
    port = free_port()  # a name that never resolves: no traffic leaves the machine
    result = start(tmp_path, "--nnodes", "1:2", "--rdzv-endpoint", f"localhost.invalid:{port}", "--insecure",
                   "--connect-timeout", "2", str(TICKER))
    assert result.returncode == 2
    assert "did not answer within 2s" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_rendezvous_port_held_by_another_program_is_named_as_such(tmp_path: Path) -> None:
    """The port is taken, so this daemon is a member of whatever holds it: a program that takes the connection and
    never speaks ZeroMQ (a torch store, a web server) is told apart from no one answering at all."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        result = start(tmp_path, "--nnodes", "1:2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--connect-timeout", "2",
                       str(TICKER))
    assert result.returncode == 2
    assert f"127.0.0.1:{port} took the connection but never answered as an elasticd within 2s" in result.stderr
    assert "another program holds that port" in result.stderr and "Traceback" not in result.stderr


def test_underscore_and_dash_flag_forms_are_both_accepted(tmp_path: Path) -> None:
    result = start(tmp_path, "--standalone", "--nproc_per_node", "1", "--max_restarts", "0", "--node_id", "solo",
                   str(TICKER), "--ticks", "2", "--interval", "0.01")
    assert result.returncode == 0, result.stderr
    assert "[solo:0] tick=1 rank=0 world=1" in result.stdout


def test_a_network_bind_without_keys_is_refused_unless_insecure(tmp_path: Path) -> None:
    refused = start(tmp_path, "--standalone", "--control", "tcp://0.0.0.0:0", str(TICKER))
    assert refused.returncode == 2
    assert "reachable from the network and --keys is not set" in refused.stderr
    assert "--insecure" in refused.stderr
    risky = start(tmp_path, "--standalone", "--control", "tcp://0.0.0.0:0", "--insecure", str(TICKER),
                  "--ticks", "1", "--interval", "0.01")
    assert risky.returncode == 0, risky.stderr
    assert "WARNING: --insecure: anyone who can reach tcp://0.0.0.0:0 can steer or kill this job" in risky.stderr


def test_an_ipc_endpoint_in_a_folder_others_can_enter_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    refused = start(tmp_path, "--standalone", "--control", f"ipc://{shared}/ctl", str(TICKER))
    assert refused.returncode == 2 and "open to other users (mode 0755)" in refused.stderr
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    ok = start(tmp_path, "--standalone", "--control", f"ipc://{private}/ctl", str(TICKER), "--ticks", "1",
               "--interval", "0.01")
    assert ok.returncode == 0, ok.stderr


def test_the_longest_hostname_is_a_node_id_that_starts_and_finishes(tmp_path: Path) -> None:
    """253 characters: its runtime files (an ipc:// socket has 107 bytes at most) must still fit."""
    node = ".".join(["n" * 63] * 3 + ["n" * 61])
    assert len(node) == 253
    result = start(tmp_path, "--standalone", "--node-id", node, "--preload", "json", str(TICKER), "--ticks", "3")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"node {node} (coordinator)" in result.stderr
