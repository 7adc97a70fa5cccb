"""The step boundary a request acts at, agreed through the job's store: a rank that hears late acts with the rest."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist


class StepFence:
    """`{prefix}/fence/{step}` exists once some rank of this generation knows of a request due at that boundary.

    Every rank looks at its boundary's key before it starts the next step, and a rank that learns of a request
    sets the key of the boundary it acts at before it starts the next step itself; no rank can finish that step
    without it (a step holds a collective), so every rank finds the key before it passes that boundary
    (docs/worker-channel.md, "Step fence").
    """

    def __init__(self, store: dist.Store, prefix: str) -> None:
        self.store, self.prefix = store, prefix

    def marked(self, step: int) -> bool:
        return bool(self.store.check([self._key(step)]))

    def mark(self, step: int) -> None:
        self.store.set(self._key(step), "1")

    def _key(self, step: int) -> str:
        return f"{self.prefix}/fence/{step}"
