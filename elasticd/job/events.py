"""The job's event log: every state change becomes a numbered event and a log line."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping

from elasticd.job import logsink
from elasticd.wire.protocol import Json, JsonObject

log = logging.getLogger("elasticd")


class EventLog:
    """Bounded, sequence-numbered history; the coordinator's copy is the job's authoritative one."""

    EVENTS_PER_NODE = 25  # a round logs about 2 per node (workers stopped, started): ~10 rounds of history

    @classmethod
    def capacity_for(cls, max_nodes: int) -> int:
        """The bound grows with the job: a fixed 5,000 is less than one round at 2,500 nodes."""
        return max(5000, cls.EVENTS_PER_NODE * max_nodes)

    def __init__(self, capacity: int = 5000) -> None:
        self._events: deque[tuple[int, float, JsonObject]] = deque(maxlen=capacity)  # (seq, ts, the event)
        self.seq = 0

    @property
    def capacity(self) -> int:
        return self._events.maxlen or 0

    def clear(self) -> None:
        """Start over (a new coordinator takes the job's log from etcd)."""
        self._events.clear()
        self.seq = 0

    def append(self, kind: str, node: str, ts: float = 0.0, **fields: Json) -> JsonObject:
        self.seq += 1
        stamp = ts or time.time()
        event: JsonObject = {"seq": self.seq, "ts": stamp, "kind": kind, "node": node, **fields}
        self._events.append((self.seq, stamp, event))
        return event

    def adopt(self, event: JsonObject) -> None:
        """Store an event numbered elsewhere (a member's replica of the coordinator's log)."""
        seq = seq_of(event)
        self.seq = max(self.seq, seq)
        self._events.append((seq, ts_of(event), event))

    def note_seq(self, seq: int) -> None:
        """A member learns the job's newest seq from the coordinator's heartbeat answer (its `hb` carries it)."""
        self.seq = max(self.seq, seq)

    def query(self, kinds: list[str] | None = None, since_ts: float = 0.0, since_seq: int = 0,
              limit: int = 500) -> list[JsonObject]:
        chosen = [
            e for seq, ts, e in self._events
            if seq > since_seq and ts >= since_ts and (not kinds or e["kind"] in kinds)
        ]
        return chosen[-limit:] if limit > 0 else chosen


def seq_of(event: Mapping[str, Json]) -> int:
    """An event's number in the job's log; 0 where it has none (an event read from elsewhere may not)."""
    seq = event.get("seq")
    return seq if isinstance(seq, int) else 0


def ts_of(event: Mapping[str, Json]) -> float:
    """When an event happened; 0.0 where it does not say."""
    ts = event.get("ts")
    return float(ts) if isinstance(ts, int | float) else 0.0


def log_line(event: Mapping[str, Json]) -> str:
    skip = {"seq", "ts", "kind", "node"}
    details = " ".join(f"{k}={v}" for k, v in event.items() if k not in skip and not isinstance(v, dict | list))
    return f"[{event['node']}] {event['kind']} {details}".rstrip()


def emit_log(event: Mapping[str, Json]) -> None:
    logsink.info(log, log_line(event))
