"""The real elastic-tui in a 120-column tmux pane, on daemons whose node ids are real-cluster host names."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from support.harness import TICKER, Job
from support.system_deps import require_binary

NODES = ("gpu-node-017.example.internal", "gpu-node-018.example.internal")
REPO = Path(__file__).resolve().parents[2]


def tmux(socket: str, *args: str) -> subprocess.CompletedProcess[str]:
    """tmux on a server of this test's own (-L): other sessions on the host are never touched."""
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True)


def wait_pane(socket: str, done: Callable[[str], bool], timeout: float = 30.0) -> str:
    """The pane's text once `done` holds for it (or the last capture, for the failure message)."""
    deadline, text = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        text = tmux(socket, "capture-pane", "-p", "-t", "console").stdout
        if done(text):
            break
        time.sleep(0.3)
    return text


def test_host_name_node_ids_are_told_apart_at_120_columns(tmp_path: Path) -> None:
    require_binary("tmux", "tmux")
    job = Job(tmp_path, nnodes="1:2", nproc=1)
    socket = f"elastic-tui-{os.getpid()}"
    try:
        for node in NODES:
            job.start(node, TICKER)
        job.wait_event("round_started", lambda e: e["world_size"] == 2)
        # COLUMNS/LINES (pytest's terminal) would override the pane's size for Textual
        command = ["env", "-u", "COLUMNS", "-u", "LINES", sys.executable, "-m", "tui.cli", "connect",
                   job.daemons[NODES[0]].control]
        env = {**job.env, "PYTHONPATH": str(REPO), "TERM": "xterm-256color"}
        started = tmux(socket, "new-session", "-d", "-s", "console", "-x", "120", "-y", "36", "-c", str(REPO),
                       *[f"-e{k}={env[k]}" for k in ("PYTHONPATH", "TERM", "ELASTICD_RUNTIME_DIR")], " ".join(command))
        assert started.returncode == 0, started.stderr
        pane = wait_pane(socket, lambda text: "gpu-node-017…" in text and "gpu-node-018…" in text
                         and "2 live" in text)
        rows = [line for line in pane.splitlines() if "active/" in line]
        assert any("gpu-node-017…" in row for row in rows) and any("gpu-node-018…" in row for row in rows), pane
        assert max(map(len, pane.splitlines())) <= 120
    finally:
        tmux(socket, "kill-server")
        job.close()
