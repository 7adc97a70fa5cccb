"""Abort this worker's process group on its daemon's word: a collective blocked on a peer that is gone fails now.

docs/architecture.md, "Healing". The daemon knows within a heartbeat that a peer's node is lost; a survivor blocked
in a collective with it would otherwise wait for the group's timeout (a frozen or unreachable peer closes no
socket). The daemon sends ABORT_SIGNAL to the process; its C-level handler writes the signal's number to the
wakeup fd even while the main thread is blocked in C++, and a thread here reads it and aborts the group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable

# A real-time signal nothing else uses; its default action would end the process, so the daemon sends it only
# to a worker whose `hello` said it handles it. None where the platform has no real-time signals.
ABORT_SIGNAL: int | None = signal.SIGRTMIN + 4 if hasattr(signal, "SIGRTMIN") else None


def watch(abort: Callable[[], None]) -> int | None:
    """Call `abort` (on a thread) each time ABORT_SIGNAL arrives. The signal's number, or None when this process
    cannot watch: not the main thread, no real-time signals, or its wakeup fd is someone else's (asyncio)."""
    if ABORT_SIGNAL is None or threading.current_thread() is not threading.main_thread():
        return None
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    if previous != -1:  # taken: leave it as it was
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return None
    signal.signal(ABORT_SIGNAL, lambda *_: None)  # handled: the wakeup fd is written; the main thread does nothing
    threading.Thread(target=_read, args=(read_fd, abort), name="elastic-abort", daemon=True).start()
    return int(ABORT_SIGNAL)


def _read(fd: int, abort: Callable[[], None]) -> None:
    assert ABORT_SIGNAL is not None  # watch() starts this thread only where it is
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        if ABORT_SIGNAL in data:  # the fd carries every handled signal's number; only ours aborts
            with contextlib.suppress(Exception):  # a failed abort leaves the group's own timeout to act
                abort()
