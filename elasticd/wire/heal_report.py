"""The `heal` a shim rank's `joined` carries (trainer_shim.heal): merged per node, then per in-place round."""

from __future__ import annotations

from typing import Any


def merge_heals(heals: list[dict[str, Any]]) -> dict[str, Any]:
    """Ranks' (or nodes') heal reports as one: bytes summed, the longest time, the first fallback's reason."""
    def total(key: str) -> int:
        return sum(int(h.get(key) or 0) for h in heals)
    fallback = next((str(h["fallback"]) for h in heals if h.get("fallback")), None)
    return {"received_bytes": total("received_bytes"), "sent_bytes": total("sent_bytes"),
            "seconds": max(float(h.get("seconds") or 0.0) for h in heals), "fallback": fallback}
