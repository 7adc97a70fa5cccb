"""Memory a pre-started data-parallel newcomer touches while it waits, which its heal then fills: off the stall.

A data-parallel newcomer receives the whole state, and what it lacks (an optimizer's lazy moments: two thirds of
AdamW's state) it receives into new memory, whose first touch is most of its heal on a small machine (a 1 GB state
joining 4->5 here: 0.15 s of zeroing on memory the machine had backed, 0.8 s where the VM backed it at that touch).
So the job's rank 0 publishes its state's size in the job's store after each generation's first step, and a
pre-started newcomer reads it, takes away what it holds itself, and touches that much before it says it is ready.
docs/architecture.md, "Memory touched before the join".
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from elasticd.wire.names import JOB_STORE_ENV
from trainer_shim.generation import open_store
from trainer_shim.state_paths import flatten

log = logging.getLogger("trainer_shim")
STATE_SIZE_KEY = "state_size"  # under the job's prefix: {device type: {dtype: [bytes, tensors]}}
ALIGN = 64  # each tensor's start in the prepared memory (a view as any dtype needs its element size's alignment)
MIN_BYTES = 1 << 20  # less is not worth a buffer of its own
READ_TIMEOUT_S = 5.0

Sizes = dict[str, dict[str, list[int]]]  # device type -> dtype name -> [bytes, tensors]


def sizes(tensors: Mapping[str, torch.Tensor]) -> Sizes:
    """The state's bytes and tensors per device type and dtype (plain tensors: sharded state is not prepared)."""
    out: Sizes = {}
    for t in tensors.values():
        if isinstance(t, DTensor):
            continue
        row = out.setdefault(t.device.type, {}).setdefault(str(t.dtype).removeprefix("torch."), [0, 0])
        row[0] += t.numel() * t.element_size()
        row[1] += 1
    return out


def publish(store: dist.Store, job_prefix: str, state: Callable[[], Any]) -> None:
    """Rank 0, once per generation, after a step (an optimizer's lazy state exists then): the size of `state()`.
    Best effort: a store that is gone shows at the next change."""
    tensors: dict[str, torch.Tensor] = {}
    try:
        flatten(state(), tensors)
        store.set(f"{job_prefix}/{STATE_SIZE_KEY}", json.dumps(sizes(tensors)))
    except Exception as exc:
        log.debug("state size not published: %r", exc)


def lacking(published: Sizes, held: Sizes) -> dict[str, int]:
    """Bytes per device type this rank would receive into new memory: what it does not hold, tensors aligned."""
    out: dict[str, int] = {}
    for device, dtypes in published.items():
        need = 0
        for dtype, (nbytes, count) in dtypes.items():
            have, have_count = held.get(device, {}).get(dtype, [0, 0])
            need += max(0, nbytes - have) + ALIGN * max(0, count - have_count)
        if need >= MIN_BYTES:
            out[device] = need
    return out


class Prepared:
    """Touched memory per device type, handed out front to back to the heal's new tensors."""

    def __init__(self, buffers: Mapping[str, torch.Tensor]) -> None:
        self.buffers = dict(buffers)
        self.used = dict.fromkeys(self.buffers, 0)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.buffers.values())

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """A tensor in this memory, or None where it does not fit (a state grown since it was published)."""
        buf = self.buffers.get(device.type)
        if buf is None or buf.device != device:
            return None
        nbytes = math.prod(shape) * dtype.itemsize
        at = self.used[device.type]
        if at + nbytes > buf.numel():
            return None
        self.used[device.type] = at + -(-nbytes // ALIGN) * ALIGN
        return buf[at:at + nbytes].view(dtype).view(shape)


def prepare(env: Mapping[str, str], state: Callable[[], Any], comm_device: torch.device,
            touch: Callable[[list[torch.Tensor]], None]) -> Prepared | None:
    """A pre-started newcomer's memory for what it lacks of the published state (it holds `state()`), touched
    (`touch`: the heal's zeroing on every core), or None: no store named (JOB_STORE_ENV), no size published yet
    (the job's first join after its start), too little to matter, or any error, a script whose state exists only
    once it joined included (best effort: the heal then allocates as it would)."""
    addr, _, prefix = env.get(JOB_STORE_ENV, "").partition("/")
    if not addr or not prefix:
        return None
    try:
        store = open_store(addr, READ_TIMEOUT_S)  # a bad address raises here, as an unreachable one does
        key = f"{prefix}/{STATE_SIZE_KEY}"
        if not store.check([key]):
            return None
        held: dict[str, torch.Tensor] = {}
        flatten(state(), held)
        need = lacking(json.loads(store.get(key)), sizes(held))
        buffers = {d: torch.empty(n, dtype=torch.uint8, device=comm_device if d == comm_device.type else "cpu")
                   for d, n in need.items() if d in ("cpu", comm_device.type)}
        if not buffers:
            return None
        touch(list(buffers.values()))
    except Exception as exc:  # never stops a worker: its heal allocates instead (an allocation too large included)
        log.debug("no memory prepared for the heal: %r", exc)
        return None
    prepared = Prepared(buffers)
    log.debug("prepared %d bytes for the heal", prepared.nbytes)
    return prepared
