"""The job's event log: every state change becomes a numbered event and a log line."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from elasticd.job import logsink

log = logging.getLogger("elasticd")


class EventLog:
    """Bounded, sequence-numbered history; the coordinator's copy is the job's authoritative one."""

    EVENTS_PER_NODE = 25  # a round logs about 2 per node (workers stopped, started): ~10 rounds of history

    @classmethod
    def capacity_for(cls, max_nodes: int) -> int:
        """The bound grows with the job: a fixed 5,000 is less than one round at 2,500 nodes."""
        return max(5000, cls.EVENTS_PER_NODE * max_nodes)

    def __init__(self, capacity: int = 5000) -> None:
        self._events: deque[dict[str, Any]] = deque(maxlen=capacity)
        self.seq = 0

    @property
    def capacity(self) -> int:
        return self._events.maxlen or 0

    def clear(self) -> None:
        """Start over (a new coordinator takes the job's log from etcd)."""
        self._events.clear()
        self.seq = 0

    def append(self, kind: str, node: str, ts: float = 0.0, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        event = {"seq": self.seq, "ts": ts or time.time(), "kind": kind, "node": node, **fields}
        self._events.append(event)
        return event

    def adopt(self, event: dict[str, Any]) -> None:
        """Store an event numbered elsewhere (a member's replica of the coordinator's log)."""
        self.seq = max(self.seq, int(event.get("seq", 0)))
        self._events.append(event)

    def note_seq(self, seq: int) -> None:
        """A member learns the job's newest seq from the coordinator's heartbeat answer (its `hb` carries it)."""
        self.seq = max(self.seq, seq)

    def query(self, kinds: list[str] | None = None, since_ts: float = 0.0, since_seq: int = 0,
              limit: int = 500) -> list[dict[str, Any]]:
        chosen = [
            e for e in self._events
            if e["seq"] > since_seq and e["ts"] >= since_ts and (not kinds or e["kind"] in kinds)
        ]
        return chosen[-limit:] if limit > 0 else chosen


def log_line(event: dict[str, Any]) -> str:
    skip = {"seq", "ts", "kind", "node"}
    details = " ".join(f"{k}={v}" for k, v in event.items() if k not in skip and not isinstance(v, dict | list))
    return f"[{event['node']}] {event['kind']} {details}".rstrip()


def emit_log(event: dict[str, Any]) -> None:
    logsink.info(log, log_line(event))
