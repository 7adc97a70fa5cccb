"""The buffers a heal copies its small pieces together in, kept for the process's life and touched before a heal.

docs/architecture.md, "Healing". A message of many small pieces (a model's norms and biases, a thousand 100 KB
tensors) is copied into one buffer before it is sent, and received into one before it is copied out. Fresh buffers
cost their first touch inside the heal (on this machine a 1,000-tensor 100 MB join spent 15 ms of its 0.11 s
faulting in receive buffers), so each rank keeps a few, reused message after message and heal after heal.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

SLOTS = 3  # messages in flight per direction, each in its own buffer
SEND, RECEIVE = "send", "receive"


class Staging:
    """Two rings of `SLOTS` CPU buffers, one per direction; a buffer up to `keep_bytes` is kept for the next message,
    a larger one (a single large piece cut across its rows) is the message's own."""

    def __init__(self, keep_bytes: int) -> None:
        self.keep_bytes = keep_bytes
        self.rings: dict[str, list[torch.Tensor | None]] = {SEND: [None] * SLOTS, RECEIVE: [None] * SLOTS}

    def buffer(self, ring: str, slot: int, nbytes: int) -> torch.Tensor:
        """`nbytes` of the ring's buffer at `slot`: the caller has finished the message it last held."""
        kept = self.rings[ring][slot]
        if kept is not None and kept.numel() >= nbytes:
            return kept[:nbytes]
        made = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes <= self.keep_bytes:
            self.rings[ring][slot] = made
        return made

    def warm(self, touch: Callable[[list[torch.Tensor]], None]) -> None:
        """Every buffer at its kept size, touched (`touch`: the heal's zeroing on every core): before a heal, by a
        process about to join or start one, so that no message of its heals waits for its memory."""
        fresh: list[torch.Tensor] = []
        for ring in self.rings.values():
            for slot, kept in enumerate(ring):
                if kept is None or kept.numel() < self.keep_bytes:
                    ring[slot] = made = torch.empty(self.keep_bytes, dtype=torch.uint8)
                    fresh.append(made)
        if fresh:
            touch(fresh)
