"""A heal's messages of many small pieces: two ranks resharding into each other never wait on each other, and
each rank copies them in the staging buffers it touched before, not in new memory."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from support.harness import free_port
from support.spawned import gloo_world, spawned
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from trainer_shim.heal import heal
from trainer_shim.heal_moves import MESSAGE_BYTES, touch
from trainer_shim.staging import SLOTS, Staging

ROWS, COLS = 64, 400  # 100 KB a tensor, 50 KB a shard: every piece goes in a bundle
TENSORS = 400  # 10 MB of shards each way: more messages than a ring has slots


def whole(i: int) -> torch.Tensor:
    return torch.arange(ROWS * COLS, dtype=torch.float32).view(ROWS, COLS) + i


def sharded(local: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size((ROWS, COLS)),
                              stride=(COLS, 1))


def member(rank: int, port: int, out: dict[int, Any]) -> None:
    """Each rank held the other's rows (the old mesh ran its ranks in the other order) and wants its own."""
    gloo_world(rank, port, 2, 5)
    old, new = DeviceMesh("cpu", torch.tensor([1, 0])), DeviceMesh("cpu", torch.tensor([0, 1]))
    held = {f"t{i}": sharded(whole(i).chunk(2)[1 - rank].clone(), old) for i in range(TENSORS)}
    wants = {f"t{i}": sharded(torch.zeros(ROWS // 2, COLS), new) for i in range(TENSORS)}
    staging = Staging(MESSAGE_BYTES)
    staging.warm(touch)
    kept = [b.data_ptr() for ring in staging.rings.values() for b in ring if b is not None]
    try:
        healed, _ = heal(5, held, None, wants, torch.device("cpu"), staging=staging)
        out[rank] = {"equal": all(torch.equal(wants[f"t{i}"].to_local(), whole(i).chunk(2)[rank])
                                  for i in range(TENSORS)),
                     "received": healed.received_bytes, "sent": healed.sent_bytes,
                     "same_buffers": kept == [b.data_ptr() for ring in staging.rings.values() for b in ring
                                              if b is not None]}
    except RuntimeError as exc:  # the exchange waited on itself until the group's timeout
        out[rank] = {"error": str(exc).splitlines()[0]}
    dist.destroy_process_group()


def test_two_ranks_resharding_into_each_other_exchange_every_row_through_their_kept_buffers() -> None:
    """Each rank sends and receives more bundled messages than a ring has slots. Posted in the plan's order on both
    ends, the exchange completes (it waited on itself until the group's timeout when each rank sent everything
    before it received anything), every row lands, and the buffers are the ones each rank touched before."""
    shard_bytes = ROWS // 2 * COLS * 4
    assert TENSORS * shard_bytes > SLOTS * MESSAGE_BYTES
    result = spawned(member, 2, free_port())
    for rank in (0, 1):
        assert "error" not in result[rank], result[rank]
        assert result[rank]["equal"]
        assert result[rank]["received"] == result[rank]["sent"] == TENSORS * shard_bytes
        assert result[rank]["same_buffers"]


def test_staging_keeps_a_buffer_up_to_its_size_and_hands_a_larger_one_out_once() -> None:
    staging = Staging(1 << 20)
    touched: list[torch.Tensor] = []
    staging.warm(touched.extend)
    kept = [b for ring in staging.rings.values() for b in ring if b is not None]
    assert len(touched) == 2 * SLOTS and sum(b.numel() for b in kept) == 2 * SLOTS << 20
    first = staging.buffer("receive", 0, 1000)
    assert first.data_ptr() == touched[SLOTS].data_ptr()  # the receive ring's first slot, touched before
    large = staging.buffer("receive", 0, 2 << 20)  # a large piece cut across its rows: its own buffer
    assert large.numel() == 2 << 20 and staging.buffer("receive", 0, 10).data_ptr() == first.data_ptr()
    staging.warm(touched.extend)
    assert len(touched) == 2 * SLOTS  # already warm: nothing new to touch
