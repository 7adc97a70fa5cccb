"""How long this rank waits for its peers in DDP's gradient allreduce: a straggler waits least, its peers most.

`Elastic.watch(ddp)` registers it as the DDP communication hook (the default allreduce, timed). Per step it
takes the last gradient bucket this rank had ready and the time that bucket's allreduce completed: the gap is
what this rank waited for the slowest rank plus the transfer. Its peers' gap is larger by as much as this rank
is slow. Reported with each step as `collective_wait_s` (smoothed), for the coordinator's straggler check.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as objects (dist.GradBucket).

import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from elasticd.wire.names import STEP_WAIT_METRIC

SMOOTHING = 0.2  # weight of the newest step in the moving average: one slow step is no straggler


class CollectiveWait:
    """The DDP hook and its per-step record; `take()` gives the smoothed wait for the step report."""

    def __init__(self) -> None:
        self.ready = 0.0  # when this rank's latest bucket of the step was ready
        self.done = 0.0  # when that bucket's allreduce completed
        self.smoothed: float | None = None
        self.fresh = False  # a bucket completed since the last take()

    def hook(self, group: dist.ProcessGroup | None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        ready = time.perf_counter()
        self.ready = max(self.ready, ready)

        def completed(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            if ready >= self.ready:  # the step's last bucket so far: its completion ends this rank's wait
                self.done = time.perf_counter()
                self.fresh = True
            return fut.value()

        return allreduce_hook(group, bucket).then(completed)  # type: ignore[arg-type]

    def take(self) -> dict[str, Any]:
        """The smoothed wait, once per step that synchronized gradients (gradient accumulation skips some)."""
        if self.fresh:
            wait = max(0.0, self.done - self.ready)
            self.smoothed = wait if self.smoothed is None else SMOOTHING * wait + (1 - SMOOTHING) * self.smoothed
            self.fresh = False
        return {} if self.smoothed is None else {STEP_WAIT_METRIC: round(self.smoothed, 6)}
