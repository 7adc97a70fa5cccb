"""What the process benchmarks share (recovery.py, daemon_overhead.py, real_daemons.py, scale_mesh.py):
launching a process whose output is read line by line, a process's CPU meter, and killing everything they
started when they exit, however they exit. No benchmark here.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
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

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TOY = ROOT / "bench" / "toy_job.py"

ALL_PROCS: list[subprocess.Popen] = []
SEEN_PIDS: set[int] = set()  # worker pids the output announced: cleanup kills those that are still workers
BASE = "-base"  # a system's twin that runs another checkout (--base-tree DIR): a change beside the tree before it


def base_tree_env(base_tree: str) -> dict[str, str]:
    """What a `-base` system runs under: its daemons, workers and CLI import the other checkout's code."""
    return {"PYTHONPATH": str(Path(base_tree).resolve()), "PYTHONSAFEPATH": "1"}


def require_base_tree(parser: argparse.ArgumentParser, systems: list[str], base_tree: str) -> None:
    """A `-base` system needs --base-tree, a checkout with elasticd/ in it."""
    if (base := [s for s in systems if s.endswith(BASE)]) and not Path(base_tree, "elasticd").is_dir():
        parser.error(f"{', '.join(base)}: --base-tree must name a checkout with elasticd/ in it")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(rank_main: Callable[..., None], args: argparse.Namespace) -> dict[int, Any]:
    """`rank_main(rank, args, port, out)` in --ranks spawned processes around a free port; what each put in
    out[rank]. torch's multiprocessing is imported here only: the other benchmarks run without torch."""
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(rank_main, args=(args, free_port(), out), nprocs=args.ranks, start_method="spawn")
        return dict(out)


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def is_worker(p: psutil.Process) -> bool:
    """A process a benchmark may kill at cleanup: a toy-job worker, or an elasticd zygote."""
    with contextlib.suppress(psutil.Error):
        return "toy_job.py" in " ".join(p.cmdline()) or is_zygote(p)
    return False


def is_zygote(p: psutil.Process) -> bool:
    """`python -m elasticd.member.processes.zygote` until it has set its title `elasticd zygote job=J node=N`."""
    with contextlib.suppress(psutil.Error):
        cmd = " ".join(p.cmdline())
        return "elasticd.member.processes.zygote" in cmd or cmd.startswith("elasticd zygote ")
    return False


def kill_all(procs: list[psutil.Process], sig: int = signal.SIGKILL) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error, OSError):
            p.send_signal(sig)


def stop_tree(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the agent or daemon, give it `grace_s` to stop its workers, then SIGKILL whatever of its tree is left."""
    procs = tree(proc.pid)
    kill_all(procs[:1], signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    kill_all(tree(proc.pid) + procs)


def cleanup() -> None:
    """SIGKILL every process launched here, their descendants, and every worker pid seen."""
    victims: list[psutil.Process] = []
    for proc in ALL_PROCS:
        victims += tree(proc.pid)
    for pid in SEEN_PIDS:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if is_worker(p):
                victims.append(p)
    kill_all(victims)
    for proc in ALL_PROCS:
        with contextlib.suppress(Exception):
            proc.wait(5)
    psutil.wait_procs(victims, timeout=5)


atexit.register(cleanup)


def on_signal(signum: int, _frame: Any) -> None:
    """SIGTERM/SIGINT handler for a benchmark's main: clean up, then exit as the signal would."""
    cleanup()
    sys.exit(128 + signum)


class Launched:
    """One process in its own session; a thread logs each output line and hands it to `on_line` as it arrives.

    A subclass sets what `on_line` needs before calling this __init__: the first line may come at once.
    """

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.log = open(log, "a", buffering=1)  # noqa: SIM115
        self.log.write(f"# {time.time():.6f} launch {' '.join(cmd)}\n")
        self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, bufsize=1, start_new_session=True)
        ALL_PROCS.append(self.proc)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.time()
            self.log.write(line)
            self.on_line(now, line)
        self.log.write(f"# {time.time():.6f} exit {self.proc.poll()}\n")

    def on_line(self, now: float, line: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """After the process is gone: the reader has drained its output, and the log is closed."""
        self.thread.join(2)
        self.log.close()


class CpuMeter:
    """A process's CPU seconds (user + system) since the last `take`."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.mark = self.now()

    def now(self) -> float:
        times = self.proc.cpu_times()
        return times.user + times.system

    def take(self) -> float:
        now = self.now()
        spent, self.mark = now - self.mark, now
        return round(spent, 3)


def write_report(out: Path, result: dict[str, Any], markdown: Callable[[dict[str, Any]], str]) -> None:
    """The run's JSON at `out`, its table beside it as .md, and the table on stdout."""
    out.write_text(json.dumps(result, indent=1))
    md = markdown(result)
    out.with_suffix(".md").write_text(md)
    print(md)
