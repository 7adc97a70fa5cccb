"""DTensor's caches, forgotten when this process's rank in a world size changed: their specs hold its old mesh.

DTensor works out each op's sharding once per input specs and keeps the answer, output specs included, keyed by
the meshes' layout (their shape, ranks and names: two meshes alike are equal). A mesh also holds this process's
coordinate in it, from the rank it had when it was built. A process that keeps its life through generations can
meet the same layout again at another rank (a world renumbered, a rehearsal's guess missed): its new tensors then
take the old mesh, and with it the old coordinate, from the cache, and everything that reads a tensor's place
from it (the heal's rows, DCP's offsets) reads the wrong one. So before each rebuild the caches are dropped where
this process was in a world of that size at another rank. docs/architecture.md, "DTensor's caches across worlds".
"""

from __future__ import annotations

import torch


class MeshCaches:
    """The rank this process had in each world size since DTensor's caches were last cleared."""

    def __init__(self) -> None:
        self.ranks: dict[int, int] = {}

    def enter(self, world_size: int, rank: int) -> bool:
        """Before a rebuild in this world: clear the caches if they may hold another rank's mesh of its layout.
        Returns whether they were cleared."""
        seen = self.ranks.get(world_size, rank)
        self.ranks[world_size] = rank
        if seen == rank:
            return False
        forget()
        self.ranks = {world_size: rank}
        return True


def forget() -> None:
    """Every DTensor cache keyed by a mesh: the C++ dispatcher's, the Python propagator's, the redistribution
    planner's (those a torch has: best effort across versions)."""
    from torch.distributed.tensor import DTensor, _redistribute

    clear_native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_native is not None:
        clear_native()
    propagator = DTensor._op_dispatcher.sharding_propagator
    for owner, name in ((propagator, "propagate_op_sharding"), (propagator, "_propagate_tensor_meta_cached"),
                        (_redistribute, "_gen_transform_infos")):
        clear = getattr(getattr(owner, name, None), "cache_clear", None)
        if clear is not None:
            clear()
    clear_planners = getattr(_redistribute, "clear_redistribute_planner_cache", None)
    if clear_planners is not None:
        clear_planners()
