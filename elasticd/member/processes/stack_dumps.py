"""A worker's Python stacks on demand: the signal the zygote arranges before the script runs, and reading the dump.

faulthandler's handler is C: it writes every thread's stack even while the main thread is blocked inside C++ (a
collective, a lock), and the script goes on. A realtime signal, so that no script's own SIGUSR1/SIGUSR2 handler
is taken (trainer_shim's abort is SIGRTMIN+4).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import signal
import time
from pathlib import Path
from typing import TextIO

STACKS_SIGNAL = signal.SIGRTMIN + 5 if hasattr(signal, "SIGRTMIN") else None
STACKS_FILE_ENV = "ELASTICD_STACKS_FILE"
MAX_DUMP_BYTES = 256 * 1024
MAX_FILE_BYTES = 8 * 1024 * 1024  # dumps asked for again and again: the file starts over (the worker appends)
MARKER = "=== elasticd: stacks asked at "  # the daemon's line before each dump; the dump follows it
_held: list[TextIO] = []  # the worker's dump file stays open for its life: faulthandler writes to its fd


def arrange(env: dict[str, str]) -> None:
    """In a forked worker, before its script: dump every thread's stack to its stacks file on STACKS_SIGNAL."""
    path = env.get(STACKS_FILE_ENV)
    if not path or STACKS_SIGNAL is None:
        return
    with contextlib.suppress(OSError, RuntimeError, ValueError):
        handle = open(path, "a")  # noqa: SIM115 - kept open for the worker's life
        faulthandler.register(STACKS_SIGNAL, file=handle, all_threads=True, chain=False)
        _held.append(handle)


_busy: dict[int, asyncio.Lock] = {}


async def capture(pid: int, path: Path, wait_s: float = 1.5) -> tuple[str, str]:
    """Signal the worker and read what it dumps: (the dump, "") or ("", why there is none)."""
    lock = _busy.setdefault(pid, asyncio.Lock())
    try:
        async with lock:  # two dumps at once would interleave in the file
            return await _capture(pid, path, wait_s)
    finally:
        if not lock.locked():
            _busy.pop(pid, None)


async def _capture(pid: int, path: Path, wait_s: float) -> tuple[str, str]:
    if STACKS_SIGNAL is None:
        return "", "this platform has no realtime signals"
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            os.truncate(path, 0)
        with open(path, "a") as handle:  # both append: the worker's dump lands after our marker
            handle.write(f"{MARKER}{time.strftime('%Y-%m-%d %H:%M:%S')} ===\n")
        start = path.stat().st_size
    except OSError:
        return "", f"no stacks file {path} (the worker did not arrange one)"
    try:
        os.kill(pid, STACKS_SIGNAL)
    except ProcessLookupError:
        return "", "the process is gone"
    except PermissionError:
        return "", "not permitted to signal the process"
    deadline, last = time.monotonic() + wait_s, start
    while time.monotonic() < deadline:  # written from inside the signal handler: done once the size holds
        await asyncio.sleep(0.03)
        size = _size(path)
        if size > start and size == last:
            break
        last = size
    size = _size(path)
    if size <= start:
        return "", f"the process did not answer within {wait_s:.1f} s (stopped, or in the kernel)"
    with open(path, "rb") as handle:
        handle.seek(max(start, size - MAX_DUMP_BYTES))
        return handle.read(MAX_DUMP_BYTES).decode(errors="replace"), ""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
