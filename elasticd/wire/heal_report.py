"""The `heal` a shim rank's `joined` carries (trainer_shim.heal), and the same record merged per node and per round."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from elasticd.wire.record import Record


@dataclass(frozen=True)
class Heal(Record):
    """What a heal moved, and why its state came from the newest checkpoint instead (null: it did not): one rank's
    (`joined`), or merged, a node's ranks' (`round_progress`) and a round's nodes' (the `resize` event)."""

    received_bytes: int = 0
    sent_bytes: int = 0
    senders: int = 0  # how many ranks it received from (merged: summed over the receivers)
    seconds: float = 0.0
    plan_s: float = 0.0  # of `seconds`: the offers' exchange and the plan
    transfer_s: float = 0.0  # of `seconds`: moving the rows
    fallback: str | None = None
    prepared_bytes: int = 0  # of `received_bytes`: into memory a pre-started newcomer touched before its round

    @classmethod
    def merged(cls, heals: Sequence[Heal], timed: Heal | None = None) -> Heal:
        """Ranks' (or nodes') heals as one: bytes and senders summed, the first fallback, and the times of `timed`
        (the rank a stall ended with: a node's last to join) where given, else the longest of each."""
        times = [timed] if timed is not None else heals
        return cls(sum(h.received_bytes for h in heals), sum(h.sent_bytes for h in heals),
                   sum(h.senders for h in heals), max(h.seconds for h in times), max(h.plan_s for h in times),
                   max(h.transfer_s for h in times), next((h.fallback for h in heals if h.fallback), None),
                   sum(h.prepared_bytes for h in heals))
