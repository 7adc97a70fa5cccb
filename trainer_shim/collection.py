"""Python's garbage collection kept out of a resize's stall: imports frozen once, no automatic pass mid-change.

docs/architecture.md, "Garbage collection and the stall". A titan-shaped worker tracks ~300,000 objects, ~250,000
of them torch's and the script's imports; a full collection walks them all (~270 ms here, bench/gc_pause.py), and
one that starts on one rank mid-resize stalls every rank. FSDP2's modules hold reference cycles, so a dropped
model is freed only by a full collection.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager


def freeze_imports(full: bool = False) -> None:
    """Everything alive now (the imports, the script's setup) out of every later collection, once per process:
    a full collection then walks only what was made since (36-50 ms for a titan-shaped world here). The young
    generations are collected first (`full`: all of them, where this rank waits anyway), so that little garbage
    is frozen with it."""
    gc.collect(2 if full else 1)
    gc.freeze()


@contextmanager
def held() -> Iterator[None]:
    """No automatic collection inside; the caller's setting after (a script that disabled it keeps it so)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def collect() -> float:
    """A full collection now, on every rank at the same point of a resize: the old world's model and optimizer
    freed at once (on a GPU, before the new world's first step needs the memory). Its seconds."""
    began = time.perf_counter()
    gc.collect()
    return time.perf_counter() - began
