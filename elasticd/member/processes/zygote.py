"""The fork server: pre-imports torch once, then forks each worker, so a restart skips ~3 s of imports.

Run by the daemon as `python -m elasticd.member.processes.zygote FD PRELOAD`; FD is its end of a unix socketpair.
The socket is SOCK_SEQPACKET: one JSON message per packet. A spawn request carries the write end
of the worker's output pipe as an SCM_RIGHTS fd. Replies: `ready`, `spawned` (pid), `exited`
(pid, code).
Workers take the title `python -u SCRIPT ARGS [elastic job= node= rank= round=]` (proctitle.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import traceback
import types
from typing import Literal, TypedDict

from elasticd.member.processes import proctitle, stack_dumps

_PR_SET_PDEATHSIG = 1


class SpawnRequest(TypedDict):
    """The daemon's request for a worker (spawner.py); the write end of its output pipe comes with it."""

    id: int
    entry: list[str]
    env: dict[str, str]
    cwd: str


class Ready(TypedDict):
    """The zygote started: what it preloaded."""

    op: Literal["ready"]
    preloaded: list[str]
    pid: int


class Spawned(TypedDict):
    """A request's worker was forked: its pid."""

    op: Literal["spawned"]
    id: int
    pid: int


class Exited(TypedDict):
    """A worker exited, with its exit code (negative: the signal)."""

    op: Literal["exited"]
    pid: int
    code: int


Message = Ready | Spawned | Exited  # what the zygote tells the daemon


def _die_with(sig: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)


def preload(modules: list[str]) -> list[str]:
    loaded = []
    for name in modules:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as exc:  # a module that fails to import here will fail in the worker, loudly
            print(f"elasticd zygote: could not preload {name}: {exc!r}", file=sys.stderr, flush=True)
    return loaded


def serve(sock: socket.socket) -> tuple[SpawnRequest, int] | None:
    """Answer spawn requests until the daemon hangs up; returns the request and its output fd in a forked child.
    A worker's exit is reported the moment it happens (SIGCHLD wakes the loop): a crash is detected by it, and a
    round waits for its old workers' exits before it starts (polling every 50 ms cost 25 ms of each on average)."""
    woken, wake = os.pipe()
    for fd in (woken, wake):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler of its own, so that the wakeup fd hears of it
    signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
    while True:
        readable, _, _ = select.select([sock.fileno(), woken], [], [])
        if woken in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(woken, 4096)
        reap(sock)
        if sock.fileno() not in readable:
            continue
        data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)  # SOCK_SEQPACKET: one request, its fd
        if not data:
            return None
        request: SpawnRequest = json.loads(data)  # as the daemon wrote it (Zygote.spawn)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            sock.close()
            os.close(ready_r)
            become_worker_session(ready_w)  # before the wakeup pipe closes: it resets SIGCHLD and the wakeup fd
            os.close(woken)
            os.close(wake)
            return request, fds[0]
        os.close(ready_w)
        os.read(ready_r, 1)  # the child leads its own session now: a killpg from the daemon reaches it
        os.close(ready_r)
        for fd in fds:
            os.close(fd)
        send(sock, {"op": "spawned", "id": request["id"], "pid": pid})


def reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(sock, {"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def send(sock: socket.socket, message: Message) -> None:
    sock.send(json.dumps(message).encode())


def become_worker_session(ready_fd: int) -> None:
    """In the forked child, before the zygote answers `spawned`: own session, default signals, PDEATHSIG."""
    os.setsid()
    _die_with(signal.SIGKILL)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)  # the zygote's own; the worker's is free for its script (and the shim's abort)
    os.write(ready_fd, b"1")
    os.close(ready_fd)


def run_worker(request: SpawnRequest, out: int) -> int:
    """In the forked child: become the worker the request describes (its output to `out`), then run its script as
    __main__."""
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the worker's stdout for life
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(request["env"])
    stack_dumps.arrange(request["env"])  # `elasticd stacks` and a hang's event read where the script is
    entry = request["entry"]
    # Before the script runs: from its first line on, ps and pkill -f see it, not the zygote.
    proctitle.set_title(proctitle.worker_title(sys.executable, entry, os.environ, proctitle.title_limit()))
    proctitle.name_kernel_task(f"elastic-r{os.environ.get('RANK', '?')}")
    os.chdir(request["cwd"])
    _match_thread_settings()
    try:
        if entry[0] == "-m":
            sys.argv = [entry[1], *entry[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(entry[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(entry)
            sys.path[0] = os.path.dirname(os.path.abspath(entry[0]))
            runpy.run_path(entry[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:
        traceback.print_exception(type(exc), exc, _script_frames(exc.__traceback__))
        return 1
    return 0


def _script_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from the script's first frame: the zygote's and runpy's own frames say nothing of the error."""
    while tb is not None and tb.tb_next is not None and (
            tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__) or "<frozen runpy>" in
            tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _match_thread_settings() -> None:
    """torch read OMP_NUM_THREADS when the zygote imported it; apply the worker's own value."""
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        with contextlib.suppress(RuntimeError):
            torch.set_num_threads(int(threads))


def main() -> None:
    proctitle.reexec_with_title_room()
    proctitle.set_title(proctitle.zygote_title(os.environ))
    _die_with(signal.SIGKILL)  # the daemon's death takes the zygote down, and that takes its workers
    os.setsid()  # a Ctrl+C at the daemon's terminal is the daemon's to handle, not ours
    sock = socket.socket(fileno=int(sys.argv[1]))
    loaded = preload([m for m in sys.argv[2].split(",") if m])
    send(sock, {"op": "ready", "preloaded": loaded, "pid": os.getpid()})
    spawn = serve(sock)
    if spawn is None:
        return
    code = run_worker(*spawn)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
