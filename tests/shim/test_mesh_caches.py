"""A process whose rank changes between worlds of one size builds on its own meshes (trainer_shim/mesh_caches.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

from trainer_shim.heal import block_of
from trainer_shim.mesh_caches import MeshCaches

pytestmark = pytest.mark.quick


def test_a_rank_renumbered_in_a_world_of_a_size_it_was_in_before_holds_its_own_rows() -> None:
    """Rank 3 of 4, then 5 of 6, then 0 of 4 (a world renumbered after a node left): each time the model's and the
    optimizer's shards say this process's own rows, which is what the heal moves and DCP writes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    meshes, worlds = MeshCaches(), []
    for world, rank in ((4, 3), (6, 5), (4, 0)):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        try:
            cleared = meshes.enter(world, rank)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
                with torch.device("meta"):
                    model = torch.nn.Linear(24, 24)
                fully_shard(model, mesh=mesh)
                model.to_empty(device="cpu")
                optim = torch.optim.AdamW(model.parameters())
                model(torch.ones(2, 24)).sum().backward()
                optim.step()
            rows = 24 // world
            for t in (model.weight, optim.state[model.weight]["exp_avg"]):
                block = block_of(t)[1]
                assert (block.lo, block.hi) == (rank * rows, (rank + 1) * rows), (world, rank, block)
            worlds.append((world, rank, cleared))
        finally:
            dist.destroy_process_group()
    assert worlds == [(4, 3, False), (6, 5, False), (4, 0, True)]  # cleared only where a world's rank changed
