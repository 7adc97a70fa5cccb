"""Generations by c10d's `reconfigure` where the installed torch has it (2.14 and newer, gloo): a survivor keeps its
group object and only the peers change; one rank that cannot makes every rank of that generation re-init.

With the pinned torch (2.13) every generation re-inits, and this test checks the same worlds that way.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from support.spawned import spawned
from torch.distributed.device_mesh import init_device_mesh

from trainer_shim.generation import RECONFIGURE_ENV, Generation, can_reconfigure, join, leave, open_store

# Each generation: the processes in rank order, and those that opt out of `reconfigure`.
PLAN: list[tuple[list[int], set[int]]] = [
    ([0, 1], set()),
    ([0, 1, 2, 3], set()),  # two newcomers
    ([3, 0, 1], set()),  # 2 leaves; 3 takes rank 0
    ([0, 1, 3, 2], set()),  # 2 comes back, with the group it held
    ([0, 1, 3, 2], {1}),  # 1 cannot reconfigure: every rank re-inits
    ([0, 1, 3, 2], set()),  # every rank can again: a new group in reconfigure mode
    ([0, 1, 3, 2], set()),
]


def mover(proc: int, store_addr: str, out: dict) -> None:
    store = open_store(store_addr, 30)
    held: list[dist.ProcessGroup] = []  # every group this process had, alive, so `is` compares objects
    seen = []
    for gen, (ranks, plain) in enumerate(PLAN, start=1):
        if proc not in ranks:
            continue
        os.environ[RECONFIGURE_ENV] = "0" if proc in plain else "1"
        world = len(ranks)
        opened = join(Generation(gen, ranks.index(proc), world, store_addr, f"test/re{gen}"), "gloo", store, 30)
        group = c10d._get_default_group()
        kept = bool(held) and group is held[-1]
        held.append(group)
        total = torch.tensor([proc + 1.0])
        dist.all_reduce(total)
        replicas = 0.0
        if world % 2 == 0:  # a device mesh's subgroups, named and keyed alike by survivors and newcomers
            mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
            ones = torch.ones(1)
            dist.all_reduce(ones, group=mesh.get_group("dp_replicate"))
            replicas = ones.item()
        seen.append((gen, dist.get_rank(), dist.get_world_size(), total.item(), replicas, kept))
        leave("gloo", False, opened)
    if dist.is_initialized():  # a group kept for `reconfigure`
        dist.destroy_process_group()
    out[proc] = seen


def test_survivors_keep_their_group_where_every_rank_can_reconfigure(store_addr: str) -> None:
    able = can_reconfigure("gloo")
    seen = spawned(mover, 4, store_addr)
    for proc, gens in seen.items():
        mine = [(gen, ranks) for gen, (ranks, _) in enumerate(PLAN, start=1) if proc in ranks]
        assert [g for g, *_ in gens] == [g for g, _ in mine]
        for (gen, rank, world, total, replicas, _), (_, ranks) in zip(gens, mine, strict=True):
            assert (rank, world) == (ranks.index(proc), len(ranks)), f"proc {proc}, generation {gen}"
            assert total == sum(p + 1 for p in ranks)
            assert replicas == (len(ranks) // 2 if len(ranks) % 2 == 0 else 0)
    kept = {(proc, gen): k for proc, gens in seen.items() for gen, *_, k in gens}
    # A survivor keeps its group object from one generation to the next only by reconfigure; a rank that opted out
    # (generation 5) made everyone re-init, and the next generation makes a group in reconfigure mode again.
    assert kept[(0, 2)] == kept[(1, 2)] == kept[(0, 3)] == kept[(3, 3)] == able
    assert all(kept[(p, 4)] == able for p in range(4))  # 2 sat generation 3 out, holding its group
    assert not any(kept[(p, 5)] or kept[(p, 6)] for p in range(4))
    assert all(kept[(p, 7)] == able for p in range(4))
