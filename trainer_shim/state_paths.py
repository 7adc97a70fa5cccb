"""A training state's tensors by path, and back: the structure a heal moves tensors into (trainer_shim/heal.py)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor


class Slot:
    """Where a tensor was in a state: its path (keys from the root)."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[type[Slot], tuple[str]]:
        return (Slot, (self.path,))


def flatten(obj: Any, tensors: dict[str, torch.Tensor], path: str = "") -> Any:
    """The state with each tensor replaced by a `Slot` (the tensor goes into `tensors` under its path)."""
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj.detach() if not isinstance(obj, DTensor) else obj
        return Slot(path)
    if isinstance(obj, dict):
        items = [(k, flatten(v, tensors, f"{path}/{k!r}")) for k, v in obj.items()]
        return OrderedDict(items) if isinstance(obj, OrderedDict) else dict(items)
    if isinstance(obj, list | tuple):
        return type(obj)(flatten(v, tensors, f"{path}/{i}") for i, v in enumerate(obj))
    return obj


def fill(skeleton: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The inverse of `flatten`: each `Slot` replaced by the tensor at its path."""
    if isinstance(skeleton, Slot):
        return tensors[skeleton.path]
    if isinstance(skeleton, dict):
        items = [(k, fill(v, tensors)) for k, v in skeleton.items()]
        return OrderedDict(items) if isinstance(skeleton, OrderedDict) else dict(items)
    if isinstance(skeleton, list | tuple):
        return type(skeleton)(fill(v, tensors) for v in skeleton)
    return skeleton
