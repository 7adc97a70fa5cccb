"""An elastic sampler that resumes mid-epoch under any world size, and the global-batch arithmetic."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


class ElasticSampler:
    """Shards one permutation per epoch by *global* position, so a new world size resumes exactly.

    The epoch's order is a permutation seeded by (seed, epoch), the same on every rank. `consumed`
    counts samples taken by the whole world; what remains is dealt round-robin over the current
    ranks, so after k lock-step rounds the first k*W remaining positions are exactly the ones seen.
    """

    def __init__(self, length: int, rank: int = 0, world_size: int = 1, seed: int = 0,
                 shuffle: bool = True) -> None:
        if length < 1:
            raise ValueError(f"dataset length must be >= 1, got {length}")
        self.length, self.seed, self.shuffle = length, seed, shuffle
        self.epoch = 0
        self.consumed = 0
        self.set_world(rank, world_size)
        self._perm: tuple[int, list[int]] | None = None

    def set_world(self, rank: int, world_size: int) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.rank, self.world_size = rank, world_size

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0

    def permutation(self) -> list[int]:
        if self._perm is None or self._perm[0] != self.epoch:
            if self.shuffle:
                # Mixing seed and epoch in one 63-bit value keeps (seed, epoch) pairs from colliding.
                g = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) % (1 << 63))
                order = torch.randperm(self.length, generator=g).tolist()
            else:
                order = list(range(self.length))
            self._perm = (self.epoch, order)
        return self._perm[1]

    @property
    def remaining(self) -> int:
        return self.length - self.consumed

    @property
    def exhausted(self) -> bool:
        return self.consumed >= self.length

    def __iter__(self) -> Iterator[int]:
        """This rank's share of the rest of the epoch; call advance() as global batches complete."""
        return iter(self.permutation()[self.consumed + self.rank :: self.world_size])

    def __len__(self) -> int:
        return len(range(self.consumed + self.rank, self.length, self.world_size))

    def advance(self, n: int) -> None:
        """Record that the whole world consumed `n` more samples of this epoch."""
        self.consumed = min(self.consumed + n, self.length)

    def global_take(self, per_rank: int) -> int:
        """How many samples the whole world takes in a round of `per_rank` each (short at the epoch tail)."""
        return min(per_rank * self.world_size, self.remaining)

    def next_batch(self, per_rank: int) -> list[int]:
        """This rank's indices for the next round (possibly fewer, even none, at the tail); advances."""
        start, stop = self.consumed, self.consumed + self.global_take(per_rank)
        batch = self.permutation()[start + self.rank : stop : self.world_size]
        self.consumed = stop
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"length": self.length, "seed": self.seed, "epoch": self.epoch, "consumed": self.consumed,
                "shuffle": int(self.shuffle)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["length"]) != self.length:
            raise ValueError(f"sampler state is for {state['length']} samples, dataset has {self.length}")
        self.seed, self.shuffle = int(state["seed"]), bool(state.get("shuffle", 1))
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        self._perm = None


@dataclass(frozen=True)
class GlobalBatch:
    """global_batch = micro_batch * world_size * accum_steps, checked at construction."""

    global_batch: int
    micro_batch: int
    world_size: int

    def __post_init__(self) -> None:
        if min(self.global_batch, self.micro_batch, self.world_size) < 1:
            raise ValueError(f"global batch {self.global_batch}, micro-batch {self.micro_batch} and "
                             f"world size {self.world_size} must all be >= 1")
        per_round = self.micro_batch * self.world_size
        if self.global_batch % per_round:
            raise ValueError(f"global batch {self.global_batch} is not divisible by micro-batch "
                             f"{self.micro_batch} x world size {self.world_size} = {per_round}; pick a "
                             f"global batch that is a multiple of {per_round} or another micro-batch")

    @property
    def accum_steps(self) -> int:
        return self.global_batch // (self.micro_batch * self.world_size)

    @classmethod
    def fit(cls, global_batch: int, world_size: int, max_micro: int) -> GlobalBatch:
        """The largest micro-batch <= max_micro that divides the global batch over this world size."""
        if max_micro < 1:
            raise ValueError(f"max_micro must be >= 1, got {max_micro}")
        if world_size >= 1 and global_batch % world_size == 0:
            per_rank = global_batch // world_size
            for micro in range(min(max_micro, per_rank), 0, -1):
                if per_rank % micro == 0:
                    return cls(global_batch, micro, world_size)
        raise ValueError(f"global batch {global_batch} cannot be split evenly over world size {world_size}; "
                         f"use a global batch that is a multiple of {world_size}")
