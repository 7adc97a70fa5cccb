"""Ranks as spawned processes, for the shim's tests without a daemon: what each rank reports, by its index."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def spawned(fn: Callable[..., None], nprocs: int, *args: Any) -> dict[int, Any]:
    """Run `fn(proc, *args, out)` in `nprocs` spawned processes until every one exits; what each put in out[proc]."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(fn, args=(*args, out), nprocs=nprocs, start_method="spawn")
        return dict(out)


def gloo_world(rank: int, port: int, size: int, timeout_s: float) -> None:
    """This spawned rank's default group: gloo over the TCP store that rank 0 serves on `port`."""
    store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=timedelta(seconds=timeout_s))
