"""How worker processes come to be: exec a fresh interpreter, or fork one from the pre-imported zygote."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Protocol

from elasticd.job.runtime import restore_open_file_limit
from elasticd.member.processes.zygote import Message, SpawnRequest

log = logging.getLogger("elasticd")
_PR_SET_PDEATHSIG = 1


class WorkerProcess(Protocol):
    """A worker process, exec'd or forked: its pid and output, and how to wait for it."""

    pid: int

    @property
    def stdout(self) -> asyncio.StreamReader | None: ...

    async def wait(self) -> int: ...


def _die_with_parent(parent: int) -> Callable[[], None]:
    """Runs in an exec'd child before exec: its own session, and SIGKILL when the daemon dies."""

    def setup() -> None:
        os.setsid()
        restore_open_file_limit()
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the daemon died between fork and prctl
            os._exit(1)

    return setup


async def exec_worker(python: str, entry: list[str], env: dict[str, str], cwd: str,
                      no_python: bool = False) -> WorkerProcess:
    argv = entry if no_python else [python, "-u", *entry]  # --no-python: the entry is a program of its own
    return await asyncio.create_subprocess_exec(
        *argv, env=env, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, preexec_fn=_die_with_parent(os.getpid()))


class ForkedWorker:
    """A worker forked by the zygote: not our child, so its exit status arrives as a zygote message."""

    def __init__(self, pid: int, stdout: asyncio.StreamReader, exited: asyncio.Future[int]) -> None:
        self.pid, self.stdout, self._exited = pid, stdout, exited

    async def wait(self) -> int:
        return await self._exited


class Zygote:
    """The fork server's process and channel: spawns workers and reports their exits."""

    def __init__(self, python: str, preload: str, env: dict[str, str]) -> None:
        self.python, self.preload, self.env = python, preload, env
        self.ready = asyncio.Event()
        self.alive = False
        self._sock: socket.socket | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._spawns: dict[int, asyncio.Future[int]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._early_exits: dict[int, int] = {}
        self._next_id = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = await asyncio.create_subprocess_exec(
            self.python, "-m", "elasticd.member.processes.zygote", str(theirs.fileno()), self.preload, env=self.env,
            pass_fds=(theirs.fileno(),), stdin=asyncio.subprocess.DEVNULL, preexec_fn=restore_open_file_limit)
        theirs.close()
        ours.setblocking(False)
        self._sock = ours
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        try:
            while data := await loop.sock_recv(self._sock, 65536):
                self._on_message(json.loads(data))
        except (OSError, ValueError) as exc:
            log.warning("zygote channel failed: %r", exc)
        self.alive = False
        self.ready.set()  # wake spawners: they fall back to exec
        for future in [*self._exits.values(), *self._spawns.values()]:
            if not future.done():
                future.set_result(-signal.SIGKILL)  # its workers died with it (PDEATHSIG)

    def _on_message(self, msg: Message) -> None:
        if msg["op"] == "ready":
            self.alive = True
            self.ready.set()
            log.info("zygote %s ready; preloaded %s", msg["pid"], ",".join(msg["preloaded"]) or "nothing")
        elif msg["op"] == "spawned":
            future = self._spawns.pop(msg["id"], None)
            if future is not None and not future.done():
                future.set_result(int(msg["pid"]))
        elif msg["op"] == "exited":
            future = self._exits.pop(msg["pid"], None)
            if future is None:
                self._early_exits[msg["pid"]] = int(msg["code"])
            elif not future.done():
                future.set_result(int(msg["code"]))

    async def spawn(self, entry: list[str], env: dict[str, str], cwd: str) -> WorkerProcess:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        read_fd, write_fd = os.pipe()
        self._next_id += 1
        spawned: asyncio.Future[int] = loop.create_future()
        self._spawns[self._next_id] = spawned
        spawn: SpawnRequest = {"id": self._next_id, "entry": entry, "env": env, "cwd": cwd}
        request = json.dumps(spawn).encode()
        try:
            socket.send_fds(self._sock, [request], [write_fd])
        finally:
            os.close(write_fd)
        pid = await asyncio.wait_for(spawned, 30)
        exited: asyncio.Future[int] = loop.create_future()
        if pid in self._early_exits:
            exited.set_result(self._early_exits.pop(pid))
        else:
            self._exits[pid] = exited
        reader = asyncio.StreamReader(limit=1 << 20)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0))
        return ForkedWorker(pid, reader, exited)

    async def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._proc.wait()
        if self._task is not None:
            self._task.cancel()


class Spawner:
    """Forks from the zygote when it is ready (waiting for it at most `wait_s`), else execs."""

    def __init__(self, python: str, zygote: Zygote | None, wait_s: float = 60.0, no_python: bool = False) -> None:
        self.python, self.zygote, self.wait_s = python or sys.executable, zygote, wait_s
        self.no_python = no_python

    async def spawn(self, entry: list[str], env: dict[str, str], cwd: str) -> WorkerProcess:
        if self.zygote is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.zygote.ready.wait(), self.wait_s)
            if self.zygote.alive:
                try:
                    return await self.zygote.spawn(entry, env, cwd)
                except (OSError, asyncio.TimeoutError) as exc:
                    log.warning("zygote spawn failed (%r); starting a fresh interpreter", exc)
        return await exec_worker(self.python, entry, env, cwd, self.no_python)
