"""A heal's rows land whatever their memory: column shards cut across their holders (rows that do not lie
contiguous, on both ends and in a rank's own copy) and bool tensors (which travel as bytes)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from support.harness import free_port
from support.spawned import gloo_world, spawned
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from trainer_shim.heal import heal

ROWS, COLS = 32, 12  # two shards of 6 columns before, three of 4 after: every new shard but the first is cut
TENSORS = 50


def whole(i: int) -> torch.Tensor:
    return torch.arange(ROWS * COLS, dtype=torch.float32).view(ROWS, COLS) * (i + 1)


def flags() -> torch.Tensor:
    return torch.arange(ROWS) % 3 == 0


def columns(local: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    return DTensor.from_local(local, mesh, [Shard(1)], run_check=False, shape=torch.Size((ROWS, COLS)),
                              stride=(COLS, 1))


def member(rank: int, port: int, out: dict[int, Any]) -> None:
    """Ranks 0 and 1 held two column shards at step 5; rank 2 is new. Each wants its third of the columns."""
    gloo_world(rank, port, 3, 10)
    old, new = DeviceMesh("cpu", torch.tensor([0, 1])), DeviceMesh("cpu", torch.tensor([0, 1, 2]))
    held: dict[str, torch.Tensor] = {}
    if rank < 2:
        held = {f"t{i}": columns(whole(i).chunk(2, dim=1)[rank].contiguous(), old) for i in range(TENSORS)}
        held["flags"] = flags()
    wants: dict[str, torch.Tensor] = {f"t{i}": columns(torch.zeros(ROWS, COLS // 3), new) for i in range(TENSORS)}
    wants["flags"] = torch.zeros(ROWS, dtype=torch.bool)
    try:
        healed, _ = heal(5, held, None, wants, torch.device("cpu"))
        out[rank] = {"equal": all(torch.equal(wants[f"t{i}"].to_local(), whole(i).chunk(3, dim=1)[rank])
                                  for i in range(TENSORS)),
                     "flags": torch.equal(wants["flags"], flags()), "received": healed.received_bytes}
    except RuntimeError as exc:
        out[rank] = {"error": str(exc).splitlines()[0]}
    dist.destroy_process_group()


def test_column_shards_cut_across_their_holders_and_bool_tensors_land_whole() -> None:
    """Rank 1's new columns 4-7 are 4-5 from rank 0 and 6-7 its own; rank 2's are rank 1's 8-11, and its flags
    arrive as bytes. Every rank ends with exactly its columns and the flags."""
    result = spawned(member, 3, free_port())
    for rank in range(3):
        assert "error" not in result[rank], result[rank]
        assert result[rank]["equal"], rank
        assert result[rank]["flags"], rank
    column_bytes = ROWS * 4
    assert result[0]["received"] == 0
    assert result[1]["received"] == 2 * column_bytes * TENSORS
    assert result[2]["received"] == 4 * column_bytes * TENSORS + ROWS  # and the flags, a byte each
