"""A large fake job (2,048 nodes of 8 ranks) for tests of a paged console: it records what the console asks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from elasticd.client import ClientError, Event
from support.fake import NOW, goodput_report

RANKS_PER_NODE = 8
STANDBY_EVERY = 256  # every 256th node is a standby: node_counts has two kinds of alive nodes


class LargeJob:
    """The job's state, shared by its links: every call asked and every PUB subscribed to now."""

    def __init__(self, count: int = 2048) -> None:
        self.count = count
        self.ids = [f"n{i:04d}" for i in range(count)]
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.subscribed: dict[str, int] = {}  # pub -> open streams
        self.rank_map = [{"node_id": n, "group_rank": i, "host": f"host-{i}",
                          "ranks": list(range(i * RANKS_PER_NODE, (i + 1) * RANKS_PER_NODE))}
                         for i, n in enumerate(self.ids) if not self.standby(i)]

    def standby(self, index: int) -> bool:
        return index % STANDBY_EVERY == STANDBY_EVERY - 1

    def record(self, index: int) -> dict[str, Any]:
        node_id = self.ids[index]
        return {"node_id": node_id, "host": f"host-{index}", "nproc": RANKS_PER_NODE, "status": "alive",
                "role": "standby" if self.standby(index) else "active", "control": f"fake://{node_id}",
                "pub": f"fake-pub://{node_id}", "last_seen_age_s": 0.3, "workers": []}

    def status(self, args: dict[str, Any]) -> dict[str, Any]:
        offset = int(args.get("nodes_offset", 0))
        limit = args.get("nodes_limit")
        end = self.count if limit is None else min(self.count, offset + int(limit))
        standby = sum(1 for i in range(self.count) if self.standby(i))
        return {"ok": True, "job_id": "big", "state": "running", "reason": "", "round": 1,
                "world_size": len(self.rank_map) * RANKS_PER_NODE, "min_nodes": 1, "max_nodes": self.count,
                "target": self.count, "coordinator": self.ids[0], "restarts": {"failure": 0}, "max_restarts": 3,
                "last_recovery": {}, "rank_map": self.rank_map, "seq": 1,
                "nodes": [self.record(i) for i in range(offset, end)], "nodes_total": self.count,
                "nodes_offset": offset, "node_counts": {"alive/active": self.count - standby,
                                                        "alive/standby": standby, "lost": 0, "left": 0}}

    def link(self, control: str) -> LargeLink:
        return LargeLink(self, control)


class LargeLink:
    """One daemon of the large job: the coordinator's PUB carries events, every PUB its own beats and steps."""

    def __init__(self, job: LargeJob, control: str) -> None:
        self.job, self.control = job, control

    async def call(self, op: str, timeout_s: float | None = None, **args: Any) -> dict[str, Any]:
        self.job.calls.append((op, args))
        if op == "status":
            return self.job.status(args)
        if op == "hello":
            return {"ok": True, "node": self.control.removeprefix("fake://"), "job_id": "big",
                    "events_pub": f"fake-pub://{self.job.ids[0]}"}
        if op == "events":
            return {"ok": True, "seq": 1, "events": [{"seq": 1, "ts": NOW, "kind": "round_started",
                                                      "node": self.job.ids[0], "round": 1, "world_size": 0}]}
        if op == "ranks":
            return {"ok": True, "round": None, "history": []}
        if op == "goodput":  # the console's page of it: the nodes that lose most, and the timeline
            report = goodput_report()
            return {**report, "nodes": [{**report["nodes"][0], "node": n} for n in self.job.ids[:args["nodes"]]]}
        if op in ("metrics", "workers"):
            return {"ok": True, "ranks": [], "nodes": {}}
        raise ClientError("unknown_op", f"unknown op {op!r}")

    async def events(self, pub: str, since_seq: int | None = None, topics: tuple[str, ...] = ("",),
                     idle_timeout_s: float | None = None) -> AsyncGenerator[Event, None]:
        node = pub.removeprefix("fake-pub://")
        index = self.job.ids.index(node)
        self.job.subscribed[pub] = self.job.subscribed.get(pub, 0) + 1
        try:
            while True:
                yield Event("hb", "heartbeat", node, 1, NOW, {"state": "running", "round": 1})
                ranks = [{"rank": r, "step": 100, "loss": 0.5} for r in range(index * RANKS_PER_NODE,
                                                                               (index + 1) * RANKS_PER_NODE)]
                yield Event("st", "steps", node, 1, NOW, {"round": 1, "ranks": ranks})
                await asyncio.sleep(0.5)
        finally:
            self.job.subscribed[pub] -= 1
            if not self.job.subscribed[pub]:
                del self.job.subscribed[pub]

    def close(self) -> None:
        pass
