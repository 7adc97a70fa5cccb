"""A sharded step's update, voted through the job's store: every rank of a generation applies it, or none does."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed import Store

FIRST_POLL_S = 0.0001  # ranks reach their update within milliseconds of each other (their last collective)
MAX_POLL_S = 0.02  # the poll's ceiling: what an update waits past the last vote, at worst


class StepNotApplied(dist.DistError):
    """A peer was lost before every rank voted for the step: nobody applies it (run_step's lost-peer path)."""


class StepCommit:
    """`{prefix}/commit/{step}` counts the ranks whose gradients for `step` are complete; a rank applies its
    update once the count is the world's. The count lives on the coordinator daemon's store, which outlives any
    worker, so the decision is one and the same on every survivor.

    Why: in HSDP a node lost between two replicas' last gradient allreduces leaves one survivor at step S+1 and
    its shard-mates at S, and no replica whole at either step; the heal then needs a checkpoint. With the vote a
    rank lost before voting leaves every survivor at S (docs/architecture.md, "Healing", "Torn steps").
    """

    def __init__(self, store: Store, prefix: str, rank: int, world_size: int, timeout_s: float) -> None:
        self.store, self.prefix, self.rank, self.world_size = store, prefix, rank, world_size
        self.timeout_s = timeout_s
        self.aborted = threading.Event()  # set by the daemon's abort (trainer_shim.abort): a peer is gone
        self.applied: int | None = None  # the last step this rank's update was voted for

    def before_update(self, step: int) -> None:
        """Vote for `step` and wait for the others' votes; raise StepNotApplied if a peer is lost first.
        The first call of a step votes; later ones (a second optimizer) pass."""
        if self.applied == step:
            return
        key = self._key(step)
        count = self.store.add(key, 1)
        poll, deadline = FIRST_POLL_S, time.monotonic() + self.timeout_s
        while count < self.world_size:
            if self.aborted.is_set() or time.monotonic() > deadline:
                if self.store.add(key, 0) < self.world_size:  # the last word: every vote is in, or not
                    raise StepNotApplied(f"step {step}: {count} of {self.world_size} ranks had voted for its update "
                                         f"when a peer was lost; no rank applies it")
                break
            time.sleep(poll)
            poll = min(poll * 2, MAX_POLL_S)
            count = self.store.add(key, 0)
        self.applied = step
        if self.rank == 0:  # every rank has voted for `step`, so each saw step-1's count complete: it can go
            self.store.delete_key(self._key(step - 1))

    def _key(self, step: int) -> str:
        return f"{self.prefix}/commit/{step}"
