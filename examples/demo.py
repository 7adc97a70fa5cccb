"""The local demo: a 2-node elastic job (nodes a and b on 127.0.0.1) and the console on it, in one terminal.

Usage: python examples/demo.py [--steps N] [--workdir DIR] [--plain] [--events]. Quitting the console (q)
stops the job. --events streams the event log instead of opening the console.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PLAIN_LOSS = r"step=(?P<step>\d+) world_size=\d+ loss=(?P<loss>[-\d.e]+)"  # what train_plain.py prints


def start_node(node: str, port: int, metrics_port: int, workdir: Path, script: Path,
               steps: int) -> subprocess.Popen[bytes]:
    log = open(workdir / f"elasticd-{node}.log", "ab")  # noqa: SIM115 - lives as long as the daemon
    output = ["--metrics-from-output", PLAIN_LOSS] if script.name == "train_plain.py" else []  # loss of a plain script
    cmd = [sys.executable, "-m", "elasticd.cli", "start", "--nnodes", "1:2", "--nproc-per-node", "2",
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "demo", "--node-id", node,
           "--max-restarts", "3", "--log-dir", str(workdir / "logs"), "--metrics-port", str(metrics_port), *output,
           str(script), *script_args(script, workdir, steps)]
    return subprocess.Popen(cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def script_args(script: Path, workdir: Path, steps: int) -> list[str]:
    if script.name == "train_shim.py":
        return ["--steps", str(steps), "--ckpt-dir", str(workdir / "ckpt"), "--step-time", "0.2", "--log-every", "10"]
    return ["--steps", str(steps), "--snapshot", str(workdir / "snapshot.pt"), "--step-time", "0.2"]


def wait_for_daemons(job: str, count: int, timeout_s: float = 30.0) -> None:
    """Block until the job's daemons have written their endpoint files (they print them as they start)."""
    import time

    from elasticd.client import discover

    deadline = time.monotonic() + timeout_s
    while len(discover(job)) < count and time.monotonic() < deadline:
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100000)
    parser.add_argument("--workdir", default="")
    parser.add_argument("--plain", action="store_true", help="run the plain torchrun script instead of the shim one")
    parser.add_argument("--events", action="store_true", help="stream events instead of opening the console")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="elastic-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    shim = HERE / "train_shim.py"
    script = HERE / "train_plain.py" if args.plain or not shim.exists() else shim
    port = free_port()
    metrics = {n: free_port() for n in ("a", "b")}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` stops the demo's daemons too, as Ctrl-C does
    nodes = [start_node(n, port, metrics[n], workdir, script, args.steps) for n in metrics]
    print(f"demo: job 'demo', nodes a and b on 127.0.0.1:{port}, running {script.name}; files in {workdir}; "
          "Prometheus metrics: " + ", ".join(f"http://127.0.0.1:{p}/metrics ({n})" for n, p in metrics.items()))
    try:
        wait_for_daemons("demo", 2)
        if args.events:
            view = [sys.executable, "-m", "elasticd.cli", "events", "--follow", "--job", "demo", "--timeout", "30"]
        else:
            view = [sys.executable, "-m", "tui.cli", "connect", "--job", "demo"]
        return subprocess.call(view, env={**os.environ})
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in nodes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in nodes:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
