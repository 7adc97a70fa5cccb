"""Real daemons as subprocesses, for end-to-end tests: start, read output, wait on job events."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from elasticd.client import Client, Credentials

ROOT = Path(__file__).resolve().parents[2]  # the checkout, two folders up
WORKERS = Path(__file__).resolve().parent / "workers"  # test workers, started by path
PLAIN = ROOT / "examples" / "train_plain.py"
SHIM = ROOT / "examples" / "train_shim.py"


# Port 0 hands out Linux's ephemeral ports (32768+), which every test's sockets draw from all the time: a port found
# free there can be taken before its daemon binds it (a daemon then joins whatever holds it). Ours come from below
# that range and above the SLURM tests' ports (10000-19999; Kubernetes' node ports start at 30000), a slice per
# xdist worker so that side-by-side tests never meet.
PORTS_LOW, PORTS_HIGH = 20000, 30000


def _port_slice() -> list[int]:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = (PORTS_HIGH - PORTS_LOW) // max(workers, 1)
    ports = list(range(PORTS_LOW + index * size, PORTS_LOW + (index + 1) * size))
    start = random.randrange(len(ports))  # a rerun starts elsewhere: the last run's ports may linger in TIME_WAIT
    return ports[start:] + ports[:start]


_PORTS = itertools.cycle(_port_slice())


def free_port() -> int:
    """A loopback port that is free now and that no other test will be handed."""
    for _ in range(PORTS_HIGH - PORTS_LOW):
        port = next(_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # held, or in TIME_WAIT from an earlier test
            return port
    raise RuntimeError(f"no free port in this test worker's slice of {PORTS_LOW}-{PORTS_HIGH}")


class DaemonProc:
    """One `elasticd start` process; its output is collected line by line."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str], prefix: list[str] | None = None) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [*(prefix or []), sys.executable, "-m", "elasticd.cli", "start", *args], cwd=cwd, env=env, text=True,
            errors="replace",  # a worker's binary output, echoed by its daemon, is read like any other
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.lines: list[str] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_line(self, pattern: str, timeout: float = 60.0, start: int = 0) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines[start:]:
                    if match := regex.search(line):
                        return match
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reading()):
                    raise AssertionError(f"no line matching {pattern!r}; output:\n" + "\n".join(self.lines[-40:]))
                self.cond.wait(min(left, 0.5))

    def _reading(self) -> bool:
        return self.proc.stdout is not None and not self.proc.stdout.closed and self.proc.poll() is None

    @property
    def control(self) -> str:
        return self.wait_line(r"control (\S+)").group(1)

    @property
    def pub(self) -> str:
        return self.wait_line(r" pub (\S+);").group(1)

    def output(self) -> str:
        with self.cond:
            return "\n".join(self.lines)

    def wait_exit(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill_with_workers(self) -> list[int]:
        """SIGKILL the daemon and its workers at once, as a node that loses power would."""
        procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        return [p.pid for p in procs]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class Job:
    """Several daemons of one job (on 127.0.0.1 unless told), each in the test's own runtime directory; as a context
    manager (`with Job(...) as job:`), every daemon it started is stopped at the end."""

    def __init__(self, tmp: Path, nnodes: str = "1:2", nproc: int = 2, max_restarts: int = 3,
                 extra: list[str] | None = None, rdzv_host: str = "127.0.0.1") -> None:
        self.tmp = tmp
        self.rdzv_host = rdzv_host
        self.port = free_port()
        self.job_id = f"job{self.port}"
        self.nnodes, self.nproc, self.max_restarts = nnodes, nproc, max_restarts
        self.extra = extra or []
        inherited = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the daemon sets its workers'
        self.env = {**inherited, "ELASTICD_RUNTIME_DIR": str(tmp / "run"), "PYTHONUNBUFFERED": "1"}
        self.daemons: dict[str, DaemonProc] = {}
        self.started: list[DaemonProc] = []
        self.credentials: Credentials | None = None  # set for a job started with --keys

    def start(self, node: str, script: Path, *script_args: str, extra: list[str] | None = None,
              wait: bool = True, prefix: list[str] | None = None) -> DaemonProc:
        """`prefix` runs the daemon elsewhere, e.g. `ip netns exec HOST` (tests/support/netlab.py)."""
        args = ["--nnodes", self.nnodes, "--nproc-per-node", str(self.nproc),
                "--rdzv-endpoint", f"{self.rdzv_host}:{self.port}", "--rdzv-id", self.job_id, "--node-id", node,
                "--max-restarts", str(self.max_restarts), "--log-dir", str(self.tmp / "logs"),
                "--grace-period", "3", *self.extra, *(extra or [])]
        if script in TORCH_FREE and "--no-zygote" not in args and not any(a.startswith("--preload") for a in args):
            args += ["--preload", "json"]  # the fork path without a torch import per daemon (~3 s of CPU each)
        args += [str(script), *script_args]
        daemon = DaemonProc(args, self.tmp, self.env, prefix)
        self.daemons[node] = daemon
        self.started.append(daemon)
        if wait:
            daemon.wait_line(r"elasticd \S+: node |elasticd start: ")  # bound (or refused), like a user would see
        return daemon

    def daemon(self, node: str = "") -> DaemonProc:
        """That node's daemon; by default the first node's newest (it holds the coordinator in most tests)."""
        return self.daemons[node or next(iter(self.daemons))]

    def client(self, node: str = "") -> Client:
        return Client(self.daemon(node).control, timeout_s=10, credentials=self.credentials)

    def wait_event(self, kind: str, match: Callable[[dict[str, Any]], bool] = lambda e: True,
                   since: int = 0, timeout: float = 60.0, node: str = "") -> dict[str, Any]:
        """Poll the job's event log until an event of `kind` after seq `since` satisfies `match`."""
        deadline = time.monotonic() + timeout
        with self.client(node) as client:
            while time.monotonic() < deadline:
                if self.daemon(node).proc.poll() is not None:  # say why rather than time out asking a dead daemon
                    raise AssertionError(f"no {kind} event: the daemon exited; its log:\n"
                                         f"{self.daemon(node).output()[-4000:]}")
                for event in client.call("events", since_seq=since, kinds=[kind], limit=0)["events"]:
                    if match(event):
                        return event
                time.sleep(0.1)
            seen = client.call("events", since_seq=since, limit=0)["events"][-40:]
        # The events say why (a `resize_failed` reason, a second round); the daemon's output is mostly steps.
        listed = "\n".join(f"{e['seq']} {e['kind']} {e.get('node', '')} round={e.get('round', '')} "
                           f"{e.get('reason') or e.get('detail') or ''}" for e in seen)
        raise AssertionError(f"no {kind} event after seq {since} within {timeout}s; the job's events since:\n"
                             f"{listed}\nlog of the first daemon:\n{self.daemon().output()[-4000:]}")

    def seq(self) -> int:
        with self.client() as client:
            return int(client.call("status")["seq"])

    def status(self, node: str = "") -> dict[str, Any]:
        with self.client(node) as client:
            return client.call("status")

    def worker_pids(self, since: int = 0) -> set[int]:
        with self.client() as client:
            events = client.call("events", kinds=["workers_started"], since_seq=since, limit=0)["events"]
        return {pid for e in events for pid in e["pids"]}

    def close(self) -> None:
        for daemon in self.started:
            daemon.stop()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_rest: object) -> None:
        if exc_type is not None:
            self.print_logs()
        self.close()

    def print_logs(self, lines: int = 200) -> None:
        """Each daemon's own last log lines (not its workers' echoed output): pytest shows what a failing test
        printed, so a CI report says what the daemons saw, which the job's files do not keep."""
        for daemon in self.started:
            node = daemon.args[daemon.args.index("--node-id") + 1] if "--node-id" in daemon.args else "?"
            said = [line for line in daemon.output().splitlines() if " elasticd " in line]
            print(f"----- daemon {node} (pid {daemon.proc.pid}): its last {min(lines, len(said))} log lines -----")
            print("\n".join(said[-lines:]))


def wait_gone(pids: set[int] | list[int], timeout: float = 15.0) -> list[int]:
    """The pids still alive (not zombies) once `timeout` has passed or all are gone."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.1)
    return alive


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

TICKER = WORKERS / "ticker.py"
SHIM_TICKER = WORKERS / "shim_ticker.py"
TORCH_FREE = (TICKER, SHIM_TICKER, WORKERS / "print_env.py", WORKERS / "loud.py")  # their zygote preloads no torch


def job_processes(job_id: str) -> list[int]:
    """Every live process that carries this job's id in its environment: its workers, wherever they came from."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TORCHELASTIC_RUN_ID") == job_id and _alive(proc.pid):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def cli(job: Job, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "elasticd.cli", *args, "--json"], env=job.env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def ticker_steps(log: Path) -> list[tuple[int, int, float]]:
    """shim_ticker's --step-log: (round, step, when) in the order the worker trained them; none before it began."""
    rows = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return [(int(r), int(s), float(t)) for r, s, t in rows]


def sample_lines(folder: Path) -> dict[int, list[tuple[int, str]]]:
    """For each rank, (step, "epoch:ids ...") in the order the rounds trained them."""
    by_rank: dict[int, list[tuple[int, str]]] = {}
    for path in sorted(folder.glob("rank*-round*.log"), key=lambda p: int(re.search(r"round(\d+)", p.name)[1])):
        rank = int(re.match(r"rank(\d+)", path.name)[1])
        for line in path.read_text().splitlines():
            step, _, ids = line.partition(" ")
            by_rank.setdefault(rank, []).append((int(step), ids))
    return by_rank


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def secure(job: Job) -> None:
    """Give the job CURVE keys (the mesh encrypted, as with `--keys`) and an operator client key."""
    store = job.tmp / "keys"
    for args in (["init"], ["create", "ops", "--role", "operator"]):
        subprocess.run([sys.executable, "-m", "elasticd.cli", "keys", "--dir", str(store), *args], check=True,
                       capture_output=True, timeout=30)
    job.extra.append(f"--keys={store}")
    job.credentials = Credentials.load(str(store / "clients" / "ops.key_secret"), str(store / "node" / "node.key"))
