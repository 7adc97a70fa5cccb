"""Whether an error means a peer is gone (healed in place) or is the script's own (raised), and its one line."""

from __future__ import annotations

from types import ModuleType

import torch.distributed as dist


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def lost_peer(exc: RuntimeError) -> bool:
    """A collective failed because a peer died or went silent: NCCL raises `DistBackendError` (a `DistError`),
    gloo a plain RuntimeError that names its own source file. Any other RuntimeError is the script's."""
    return isinstance(exc, dist.DistError) or "gloo" in str(exc)


def lost_in_save(exc: BaseException) -> bool:
    """A DCP save failed because a peer is gone: the collective's own error, or one DCP gathered from a rank."""
    return any(isinstance(e, RuntimeError) and lost_peer(e) for e in sharded().save_errors(exc))


def sharded() -> ModuleType:
    """trainer_shim.sharded, imported where a sharded script first needs it: its DCP import (~45 ms) stays out
    of every other worker's start."""
    import trainer_shim.sharded

    return trainer_shim.sharded
