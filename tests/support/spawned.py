"""Ranks as spawned processes, for the shim's tests without a daemon: what each rank reports, by its index."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def spawned(fn: Callable[..., None], nprocs: int, *args: Any) -> dict[int, Any]:
    """Run `fn(proc, *args, out)` in `nprocs` spawned processes until every one exits; what each put in out[proc]."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(fn, args=(*args, out), nprocs=nprocs, start_method="spawn")
        return dict(out)
