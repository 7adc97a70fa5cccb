"""The `heal` a shim rank's `joined` carries (trainer_shim.heal): merged per node, then per in-place round."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from elasticd.wire.protocol import Json
from elasticd.wire.record import Record


@dataclass(frozen=True)
class Heal(Record):
    """What one rank's heal moved, and why its state came from the newest checkpoint instead (null: it did not)."""

    received_bytes: int = 0
    sent_bytes: int = 0
    senders: int = 0  # how many ranks it received from
    seconds: float = 0.0
    plan_s: float = 0.0  # of `seconds`: the offers' exchange and the plan
    transfer_s: float = 0.0  # of `seconds`: moving the rows
    fallback: str | None = None


class MergedHeal(TypedDict):
    """What healing moved: bytes each way, how long it took, and why it fell back to a checkpoint (if it did)."""

    received_bytes: int
    sent_bytes: int
    seconds: float
    plan_s: float
    transfer_s: float
    fallback: str | None


def merge_heals(heals: Sequence[Mapping[str, Json]]) -> MergedHeal:
    """Ranks' (or nodes') heal reports as one: bytes summed, the longest of each time, the first fallback's reason."""
    def number(heal: Mapping[str, Json], key: str) -> float:
        value = heal.get(key)
        return value if isinstance(value, int | float) else 0.0

    def total(key: str) -> int:
        return sum(int(number(h, key)) for h in heals)

    def longest(key: str) -> float:
        return max(float(number(h, key)) for h in heals)
    fallback = next((str(h["fallback"]) for h in heals if h.get("fallback")), None)
    return {"received_bytes": total("received_bytes"), "sent_bytes": total("sent_bytes"),
            "seconds": longest("seconds"), "plan_s": longest("plan_s"), "transfer_s": longest("transfer_s"),
            "fallback": fallback}
