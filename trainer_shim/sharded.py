"""Sharded save/load through torch.distributed.checkpoint, made atomic by a temp directory and a rename."""

from __future__ import annotations

import os
import re
import shutil
import time
import warnings
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from trainer_shim.checkpoint import Reporter, SaveResult, fsync_dir
from trainer_shim.heal import replicated

_NAME = re.compile(r"^sharded-(\d{8,})$")


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _solo() -> bool:
    # One rank needs no planning collectives; they also need numpy (object collectives), absent on CPU CI.
    return not dist.is_initialized() or dist.get_world_size() == 1


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def list_sharded(directory: str) -> list[tuple[int, str]]:
    """(step, path) oldest first, only complete ones: dcp writes `.metadata` last, the rename comes after."""
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        m = _NAME.match(name)
        path = os.path.join(directory, name)
        if m and os.path.isfile(os.path.join(path, ".metadata")):
            found.append((int(m.group(1)), path))
    return sorted(found)


def save_sharded(state: dict[str, Any], directory: str, step: int, keep: int = 2,
                 session: Reporter | None = None, request_id: str | None = None) -> SaveResult:
    """Collective: every rank calls it on a shared directory. Rank 0 renames, prunes and reports."""
    start = time.perf_counter()
    final = os.path.join(directory, f"sharded-{step:08d}")
    tmp = final + ".tmp"
    if _rank() == 0:
        os.makedirs(directory, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a torn attempt from a crashed round
    _barrier()
    with warnings.catch_warnings():  # dcp warns that one process means no collectives: intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, checkpoint_id=tmp, no_dist=_solo())
    _barrier()  # every shard is written before the directory becomes visible under its final name
    nbytes = 0
    if _rank() == 0:
        nbytes = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp))
        for f in os.listdir(tmp):  # dcp does not fsync its files; the rename must not outrun them
            fd = os.open(os.path.join(tmp, f), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(directory)
        others = [p for _, p in list_sharded(directory) if p != final]
        for old in others[: max(len(others) + 1 - keep, 0)]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    result = SaveResult(step, final, nbytes, time.perf_counter() - start, request_id)
    if session is not None and _rank() == 0:
        session.report_checkpoint(step, final, nbytes, result.duration_s, request_id)
    return result


def load_sharded(state: dict[str, Any], directory: str) -> int | None:
    """Collective: loads the newest complete sharded checkpoint into `state` in place; its step, or None. Rank
    0's listing decides, so that every rank reads the same one (a save's rename may land between two listings)."""
    found = list_sharded(directory)
    newest: list[Any] = [found[-1] if found else None]
    if not _solo():
        dist.broadcast_object_list(newest, src=0)
    if newest[0] is None:
        return None
    step, path = newest[0]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=path, no_dist=_solo())
    return step


def full_shards(tensors: dict[str, Any]) -> dict[str, Any]:
    """Collective: each DTensor that no other rank holds a copy of (no replicate dim) gathered whole, the rest as
    they are. Every rank must pass the same paths in the same order (they come from the same state_dict)."""
    return {p: t if replicated(t) else t.full_tensor() for p, t in tensors.items()}


def save_errors(exc: BaseException) -> list[BaseException]:
    """The errors behind a failed DCP call: those DCP gathered from its ranks, or the error itself."""
    if isinstance(exc, CheckpointException):
        return [error for error, _ in exc.failures.values()]
    return [exc]
