"""The local worker processes of one round: spawn with torchrun's env contract, watch, stop, log."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import string
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from elasticd.job.config import JobConfig
from elasticd.member.processes.output import OutputLines
from elasticd.member.processes.spawner import ForkedWorker, Spawner, WorkerProcess
from elasticd.member.processes.stack_dumps import STACKS_FILE_ENV
from elasticd.wire.assignment import RoundAssignment
from elasticd.wire.names import NEXT_WORLDS_ENV

READ_CHUNK = 64 * 1024
GATHER_S = 0.05  # output waits at most this long in the pipe's buffer before the log file, `logs` and the echo
HOSTNAME = socket.gethostname()  # --log-line-prefix-template's ${hostname}
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # torch's @record writes the exception there, as under torchrun


@dataclass
class Worker:
    """One local worker of a round: its ranks, its process, its log and what it leaves for diagnosis."""

    local_rank: int
    rank: int
    proc: WorkerProcess
    log_path: Path
    started: float
    exit_code: int | None = None
    exited_at: float = 0.0
    stopping: bool = False
    failure_sent: bool = False  # reported once its error file appeared: its exit is not reported again
    ps: psutil.Process | None = None
    output: OutputLines = field(default_factory=OutputLines)
    watch: asyncio.Task[None] | None = None  # reads its output and reports its exit; moves with it to a new round

    @property
    def folder(self) -> Path:
        """Its own folder beside its log, as torchrun gives each local rank one: error.json, stacks.txt."""
        return self.log_path.parent / str(self.local_rank)

    @property
    def error_file(self) -> Path:
        return self.folder / "error.json"

    @property
    def stacks_file(self) -> Path | None:
        """Where it dumps its stacks on STACKS_SIGNAL: only a worker the zygote forked arranged that."""
        return self.folder / "stacks.txt" if isinstance(self.proc, ForkedWorker) else None

    @property
    def status(self) -> str:
        return "running" if self.exit_code is None else ("succeeded" if self.exit_code == 0 else "failed")

    def info(self) -> dict[str, Any]:
        cpu = rss = 0.0
        if self.exit_code is None and self.ps is not None:
            with contextlib.suppress(psutil.Error), self.ps.oneshot():
                cpu, rss = self.ps.cpu_percent(), self.ps.memory_info().rss
        return {
            "pid": self.proc.pid, "local_rank": self.local_rank, "rank": self.rank,
            "state": self.status,
            "exit_code": self.exit_code, "cpu_percent": cpu, "rss": int(rss),
            "uptime_s": round(time.time() - self.started, 1), "log": str(self.log_path),
        }


ExitHandler = Callable[[Worker], None]
LineHandler = Callable[[Worker, str], None]


def signal_worker(pid: int, sig: int) -> None:
    """The worker's whole process group (its data loaders too); the process alone if it has no group yet."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    except PermissionError:
        pass


def next_worlds(cfg: JobConfig, world: int) -> list[int]:
    """The world sizes one change from `world`: a node of this one's size more, or fewer, within --nnodes."""
    n = cfg.nproc_per_node
    return [size for size in (world + n, world - n) if cfg.min_nodes * n <= size <= cfg.max_nodes * n]


def base_env(cfg: JobConfig) -> dict[str, str]:
    """What every worker's environment starts from (the zygote imports torch under it too)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(cfg.omp_threads))
    env.update(cfg.env)
    # The job id is in the zygote's environment too: /proc/PID/environ of a forked worker is the zygote's,
    # and this is how ps-style tools (and our orphan checks) tell the job's processes apart.
    env.update(PYTHONUNBUFFERED="1", TORCHELASTIC_RUN_ID=cfg.job_id, ELASTICD_JOB_ID=cfg.job_id,
               ELASTICD_NODE_ID=cfg.node_id)
    return env


class WorkerGroup:
    """All workers of this node for one round."""

    def __init__(self, cfg: JobConfig, round_id: int, assignment: RoundAssignment, extra_env: dict[str, str],
                 on_exit: ExitHandler, spawner: Spawner, on_line: LineHandler | None = None,
                 kept: list[Worker] | None = None) -> None:
        self.cfg = cfg
        self.spawner = spawner
        self.round_id = round_id
        self.assignment = assignment
        self.extra_env = extra_env
        self.on_exit = on_exit
        self.on_line = on_line
        # Workers kept from the last round (an in-place resize) take this node's lowest ranks, in their old order,
        # and keep their local rank (their device); spawn() forks the rest.
        self.workers: list[Worker] = sorted(kept or [], key=lambda w: w.rank)
        for worker, rank in zip(self.workers, assignment.ranks, strict=False):
            worker.rank = rank

    def env_for(self, local_rank: int, rank: int) -> dict[str, str]:
        a, cfg = self.assignment, self.cfg
        env = base_env(cfg)
        env.update({
            "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(a.world_size),
            "LOCAL_WORLD_SIZE": str(cfg.nproc_per_node), "GROUP_RANK": str(a.group_rank),
            "GROUP_WORLD_SIZE": str(a.group_world_size), "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(a.world_size), "ROLE_NAME": cfg.role,
            "MASTER_ADDR": a.master_addr, "MASTER_PORT": str(a.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(a.restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(a.max_restarts), "TORCHELASTIC_RUN_ID": cfg.job_id,
            "TORCHELASTIC_USE_AGENT_STORE": "False", "PYTHONUNBUFFERED": "1",
            "ELASTICD_NODE_ID": cfg.node_id, "ELASTICD_ROUND": str(self.round_id),
            "ELASTICD_JOB_ID": cfg.job_id, "ELASTICD_HANG_TIMEOUT": str(cfg.hang_timeout_s),
        })
        if a.store:  # the job's long-lived store and this generation's prefix in it (in-place resizes)
            env.update(ELASTICD_STORE=a.store, ELASTICD_STORE_PREFIX=a.prefix)
            if not a.in_place and a.restart_count == 0 and (worlds := next_worlds(cfg, a.world_size)):
                env[NEXT_WORLDS_ENV] = ",".join(map(str, worlds))  # the job's start: rehearsed before its first world
        env.update(self.extra_env)
        return env

    def diagnosis_env(self, folder: Path) -> dict[str, str]:
        """Where a worker leaves its error (torch's @record), its stacks, and NCCL's Flight Recorder trace."""
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # a stale one from a worker of an earlier job in this folder
            (folder / "error.json").unlink()
        env = {ERROR_FILE_ENV: str(folder / "error.json"), STACKS_FILE_ENV: str(folder / "stacks.txt")}
        ours = {**os.environ, **self.cfg.env}
        for key, value in (("TORCH_FR_BUFFER_SIZE", "2000"), ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"),
                           ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(folder / "nccl_trace_rank_"))):
            if key not in ours:  # the user's own settings win
                env[key] = value
        return env

    async def spawn(self) -> None:
        log_dir = Path(self.cfg.log_dir) / self.cfg.job_id / self.cfg.node_id / f"round-{self.round_id:04d}"
        log_dir.mkdir(parents=True, exist_ok=True)
        ranks = self.assignment.ranks[len(self.workers):]
        taken = {w.local_rank for w in self.workers}
        free = [slot for slot in range(len(self.assignment.ranks)) if slot not in taken]
        for local_rank, rank in zip(free, ranks, strict=False):
            log_path = log_dir / f"rank-{rank}.log"
            env = {**self.env_for(local_rank, rank), **self.diagnosis_env(log_dir / str(local_rank))}
            proc = await self.spawner.spawn(self.cfg.entry, env, os.getcwd())
            worker = Worker(local_rank, rank, proc, log_path, time.time())
            with contextlib.suppress(psutil.Error):
                worker.ps = psutil.Process(proc.pid)
            self.workers.append(worker)
            worker.watch = asyncio.create_task(self._watch(worker))

    async def _watch(self, worker: Worker) -> None:
        """Copy its output to its log in chunks (a 10 MB line or binary bytes pass as is), then report its exit."""
        assert worker.proc.stdout is not None
        exited = asyncio.ensure_future(worker.proc.wait())
        log_file = None
        with contextlib.suppress(OSError):  # its log folder removed: its output still reaches `logs` and the console
            log_file = open(worker.log_path, "ab")  # noqa: SIM115 - open for the worker's life, closed below
        try:
            while chunk := await worker.proc.stdout.read(READ_CHUNK):
                if log_file is not None:
                    try:
                        log_file.write(chunk)
                        log_file.flush()
                    except OSError:  # a full disk costs the log, never the watch
                        pass
                self._lines(worker, worker.output.feed(chunk))
                if len(chunk) < READ_CHUNK and not exited.done():
                    # A trickle gathers a while, so 8 chatty ranks cost tens of wake-ups a second, not thousands;
                    # an exit ends the wait at once (the crash's detection must not wait on it).
                    await asyncio.wait((exited,), timeout=GATHER_S)
        except asyncio.CancelledError:
            exited.cancel()  # the daemon stops: nothing will wait for the exit
            raise
        finally:
            if log_file is not None:
                with contextlib.suppress(OSError):
                    log_file.close()
        self._lines(worker, worker.output.flush())
        worker.exit_code = await exited
        worker.exited_at = time.time()
        self.on_exit(worker)

    def _lines(self, worker: Worker, lines: list[tuple[bytes, str]]) -> None:
        if self.on_line is not None:
            for _raw, text in lines:
                self.on_line(worker, text)
        if lines and (self.cfg.console_ranks is None or worker.local_rank in self.cfg.console_ranks):  # --redirects
            prefix = self._prefix(worker).encode()  # a worker kept in place shows its new rank
            sys.stdout.buffer.write(b"".join(prefix + raw if raw.endswith(b"\n") else prefix + raw + b"\n"
                                             for raw, _text in lines))
            sys.stdout.flush()

    def _prefix(self, worker: Worker) -> str:
        """An echoed line's prefix: --log-line-prefix-template's (torchrun's macros), or [NODE:RANK]."""
        if not self.cfg.line_prefix:
            return f"[{self.cfg.node_id}:{worker.rank}] "
        return string.Template(self.cfg.line_prefix).substitute(
            role_name=self.cfg.role, local_rank=worker.local_rank, rank=worker.rank, hostname=HOSTNAME)

    @property
    def running(self) -> list[Worker]:
        return [w for w in self.workers if w.exit_code is None]

    def signal_all(self, sig: int) -> None:
        for worker in self.running:
            signal_worker(worker.proc.pid, sig)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM every process group, wait out the grace period, then SIGKILL what is left."""
        for worker in self.workers:
            worker.stopping = True
        self.signal_all(signal.SIGTERM)
        watches = [w.watch for w in self.running if w.watch is not None]
        if watches:  # each ends as its worker's exit is reported: the round goes on at the last one, not a poll
            await asyncio.wait(watches, timeout=grace_s)
        if self.running:
            self.signal_all(signal.SIGKILL)
        # Grandchildren that left the group are not ours to chase; the group kill covers the usual ones.
        await asyncio.gather(*(w.watch for w in self.workers if w.watch is not None), return_exceptions=True)

    def release(self, workers: list[Worker]) -> None:
        """Hand these workers to the next round (kept in place): this group no longer stops or reports them."""
        self.workers = [w for w in self.workers if w not in workers]

    def kill_worker(self, rank: int, sig: int = signal.SIGKILL) -> bool:
        for worker in self.running:
            if worker.rank == rank:
                signal_worker(worker.proc.pid, sig)
                return True
        return False

    def info(self) -> list[dict[str, Any]]:
        return [{**w.info(), "round": self.round_id} for w in self.workers]
