"""A deterministic job for the console's tests: fixed replies, fixed timestamps, the DaemonLink interface."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import AsyncGenerator, Callable
from typing import Any

from elasticd.client import ClientError, Event

NOW = 1_700_000_000.0
NODES = {"a": ("node-a.example", [0, 1], "active"), "b": ("node-b.example", [2, 3], "active"),
         "c": ("node-c.example", [], "standby")}
LAST_SEEN_AGE = {"a": 0.2, "b": 0.4, "c": 2.0}  # c: one late heartbeat, stale
GIB = 1 << 30


def gpu_of(rank: int) -> dict[str, Any] | None:
    """A worker's GPU record as a daemon with NVML reports it; rank 3 runs on no GPU (null)."""
    if rank == 3:
        return None
    return {"index": rank % 2, "util_percent": 90 - 5 * rank, "mem_used_bytes": (30 + rank) * GIB,
            "mem_total_bytes": 80 * GIB, "temp_c": 60 + rank, "power_w": 300.0 - 10 * rank,
            "proc_mem_bytes": (24 + rank) * GIB}


ROUND_2_STEP = 120  # rank 3 failed here: round 2 restarts the workers


ROOT_CAUSE = {"node": "b", "rank": 3, "round": 1, "exit_code": 1, "signal": "", "pid": 2002, "at": NOW - 540,
              "error": {"type": "ValueError", "message": "bad batch", "where": "train.py:42 in step",
                        "file": "/job/train.py", "line": 42, "source": "output",
                        "traceback": 'Traceback (most recent call last):\n  File "/job/train.py", line 42, in step\n'
                                     "ValueError: bad batch"},
              "hang": False, "reason": "rank 3 exited 1", "log": "/nonexistent/logs/demo/b/round-0001/rank-3.log",
              "error_file": "", "consequences": 1}  # status.root_cause: rank 3's failure ended round 1


def fixed_clock() -> float:
    return NOW


def loss_at(rank: int, step: int) -> float:
    return round(2.5 * math.exp(-step / 60) + 0.3 + 0.02 * math.sin(step + rank), 4)


def timeline(total: float) -> dict[str, float]:
    return {"detect": 0.0, "rendezvous": 0.1, "stopped": round(total * 0.4, 3), "spawned": round(total * 0.6, 3),
            "first_step": total}


def history_events() -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []

    def add(kind: str, node: str, **fields: Any) -> None:
        events.append({"seq": len(events) + 1, "ts": NOW - 600 + 10 * len(events), "kind": kind, "node": node,
                       **fields})

    add("node_joined", "a", host="node-a.example", nproc=2, role="active")
    add("node_joined", "b", host="node-b.example", nproc=2, role="active")
    add("round_started", "a", round=1, world_size=4, cause="start", detail="node b joined",
        rank_map={"a": [0, 1], "b": [2, 3]})
    add("workers_started", "a", round=1, ranks=[0, 1], world_size=4, pids=[1001, 1002])
    add("workers_started", "b", round=1, ranks=[2, 3], world_size=4, pids=[2001, 2002])
    add("round_complete", "a", round=1, cause="start", timeline=timeline(1.2))
    add("worker_exited", "b", round=1, rank=3, pid=2002, exit_code=1)
    add("round_started", "a", round=2, world_size=4, cause="failure", detail="rank 3 exited 1",
        rank_map={"a": [0, 1], "b": [2, 3]})
    add("workers_started", "a", round=2, ranks=[0, 1], world_size=4, pids=[1003, 1004])
    add("workers_started", "b", round=2, ranks=[2, 3], world_size=4, pids=[2003, 2004])
    add("first_step", "a", round=2, cause="failure", timeline=timeline(3.4))
    add("node_joined", "c", host="node-c.example", nproc=2, role="standby")
    for rank in range(4):
        add("checkpoint_saved", "a" if rank < 2 else "b", rank=rank, step=200, path=f"/ckpt/step-200/rank-{rank}.pt",
            bytes=48_000_000 + rank * 1000, duration_s=0.8 + rank / 10)
    add("interlock_refused", "a", op="drain", reason="node a is the coordinator; use --force")
    return events


def log_path(node: str, rank: int) -> str:
    return f"/nonexistent/logs/demo/{node}/round-0002/rank-{rank}.log"


def printed(rank: int) -> list[str]:
    """What a rank of round 2 printed: a line every ten steps."""
    return [f"[rank {rank}] step {step} loss {loss_at(rank, step):.4f}" for step in range(160, 241, 10)]


def stack(rank: int) -> dict[str, Any]:
    """A rank's faulthandler dump as `stacks` returns it: each rank in `step`, a line apart."""
    line = 17 + rank
    return {"rank": rank, "pid": 1003 + rank, "where": f"train.py:{line} in step", "note": "",
            "text": f'Current thread 0x00007f00000000{rank:02d} (most recent call first):\n'
                    f'  File "/job/train.py", line {line} in step\n  File "/job/train.py", line 60 in main'}


def goodput_report() -> dict[str, Any]:
    """The fake job's 600 s as `goodput` accounts them: start-up, rank 3's crash and the steps redone after it."""
    bins: list[dict[str, float]] = [{"training": 20.0} for _ in range(30)]
    bins[0] = {"recovery.start": 12.0, "training": 8.0}
    bins[10] = {"recovery.crash": 3.4, "redone": 9.0, "training": 7.6}
    bins[11] = {"redone": 11.0, "training": 9.0}
    bins[25] = {"checkpoint": 1.1, "training": 18.9}
    life = {"training": 563.5, "checkpoint": 1.1, "redone": 20.0, "waiting": 0.0,
            "recovery": {"start": 12.0, "crash": 3.4}, "accounted_s": 600.0, "training_share": 0.9392}
    nodes = [{"node": n, "goodput": 0.9392, "seconds": 600.0, "idle": 0.0,
              "lost": {"checkpoint": 1.1, "recovery.crash": 3.4, "recovery.start": 12.0, "redone": 20.0}}
             for n in ("a", "b")] + [{"node": "c", "goodput": 0.0, "seconds": 200.0, "idle": 200.0, "lost": {}}]
    return {"ok": True, "goodput": 0.9392, "redone_steps": 40, "wall_s": 600.0, "life": life,
            "window": {**life, "seconds": 3600.0}, "nodes": sorted(nodes, key=lambda r: r["goodput"]),
            "idle_node_s": 200.0, "timeline": {"start": NOW - 600, "width_s": 20.0, "bins": bins}}


class FakeLink:
    """Answers like a daemon of the fake job; `drain a` is refused without force, like the real interlock.

    With `gpu`, its daemons have NVML: every worker record carries `gpu` (a record, or null).
    """

    def __init__(self, control: str, gpu: bool = False) -> None:
        self.control, self.gpu = control, gpu
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.printed = {rank: printed(rank) for rank in range(4)}  # each rank's log, as lines; tests add more
        self.round = 2
        self.earlier: dict[int, dict[int, list[str]]] = {}  # the logs of the rounds before, by round
        self.skip = 0  # bytes the next follow of a log skips, as a node does for a reader far behind
        self.unanswered: dict[str, float] = {}  # node -> how many of its next node queries time out (inf: all)
        self.roles = {node: role for node, (_, _, role) in NODES.items()}  # tests drain a node here

    def silence(self, node: str, reads: float = math.inf) -> None:
        """Node queries to `node` time out: its next `reads` of them (by default every one), then it answers."""
        self.unanswered[node] = reads

    async def call(self, op: str, timeout_s: float | None = None, **args: Any) -> dict[str, Any]:
        self.calls.append((op, args))
        handler = getattr(self, f"op_{op.replace('-', '_')}", None)
        if handler is None:
            raise ClientError("unknown_op", f"unknown op {op!r}")
        return dict(handler(args))

    def op_status(self, args: dict[str, Any]) -> dict[str, Any]:
        nodes = [{"node_id": n, "host": host, "nproc": 2, "role": self.roles[n], "status": "alive",
                  "control": f"fake://{n}", "pub": f"fake-pub://{n}", "last_seen_age_s": LAST_SEEN_AGE[n]}
                 for n, (host, _, _) in NODES.items()]
        in_round = [n for n in ("a", "b") if self.roles[n] == "active"]
        rank_map = [{"node_id": n, "group_rank": i, "host": NODES[n][0], "ranks": NODES[n][1]}
                    for i, n in enumerate(in_round)]
        return {"ok": True, "job_id": "demo", "state": "running", "reason": "", "round": self.round, "world_size": 4,
                "min_nodes": 1, "max_nodes": 3, "target": 2, "coordinator": "a",
                "restarts": {"failure": 1, "membership": 0, "operator": 0, "hang": 0}, "max_restarts": 3,
                "last_recovery": timeline(3.4), "rank_map": rank_map, "nodes": nodes, "seq": 17,
                "root_cause": ROOT_CAUSE}

    def op_events(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "events": history_events(), "seq": 17}

    def op_metrics(self, args: dict[str, Any]) -> dict[str, Any]:
        ranks = [{"node": "a" if r < 2 else "b", "rank": r, "round": 2, "step": 240, "loss": loss_at(r, 240),
                  "throughput": 128.0, "step_age_s": 0.1, "dropped": 0, "checkpoint_step": 200,
                  "checkpoint_path": f"/ckpt/step-200/rank-{r}.pt", "checkpoint_age_s": 42.0 if r < 3 else 900.0}
                 for r in range(4)]
        return {"ok": True, "ranks": ranks}

    def op_workers(self, args: dict[str, Any]) -> dict[str, Any]:
        def worker(node: str, local: int, rank: int) -> dict[str, Any]:
            return {"pid": 1003 + rank, "local_rank": local, "rank": rank, "state": "running", "exit_code": None,
                    "cpu_percent": 97.0, "rss": 512 * 1024 * 1024, "uptime_s": 300.0,
                    "log": log_path(node, rank), "round": 2,
                    **({"gpu": gpu_of(rank)} if self.gpu else {})}

        return {"ok": True, "nodes": {"a": [worker("a", 0, 0), worker("a", 1, 1)],
                                      "b": [worker("b", 0, 2), worker("b", 1, 3)], "c": []}}

    def queried(self, args: dict[str, Any]) -> tuple[str, list[int]]:
        """A node query's node and its ranks asked for, or the error its daemon would answer."""
        node = str(args.get("node"))
        if node not in NODES:
            raise ClientError("not_found", f"no node '{node}' in this job")
        if self.unanswered.get(node, 0) > 0:
            self.unanswered[node] -= 1
            raise ClientError("timeout", f"node {node} did not answer within 4 s")
        ranks = [rank for rank in NODES[node][1] if args.get("rank") in (None, rank)]
        if not ranks:
            what = "workers" if args.get("rank") is None else f"rank {args['rank']}"
            raise ClientError("not_found", f"node {node} has no {what} in round {self.round}")
        return node, ranks

    def restart(self) -> None:
        """A new round: every rank's log so far is the round before's, and each starts a new one."""
        self.earlier[self.round] = self.printed
        self.round += 1
        self.printed = {rank: [] for rank in range(4)}

    def op_logs(self, args: dict[str, Any]) -> dict[str, Any]:
        node, ranks = self.queried(args)
        rnd = args.get("round") or self.round
        return {"ok": True, "node": node, "round": rnd, "ranks": [self.log(node, rank, rnd, args) for rank in ranks]}

    def log(self, node: str, rank: int, rnd: int, args: dict[str, Any]) -> dict[str, Any]:
        """The last `tail` lines of round `rnd`'s log, or those past byte `since` (after `skip` bytes, once)."""
        written = self.printed[rank] if rnd == self.round else self.earlier[rnd][rank]
        data = "".join(f"{line}\n" for line in written).encode()
        skipped, tail = 0, int(args.get("tail") or 0)
        if args.get("since") is None:
            lines = written[-tail:] if tail else []
        else:
            skipped, self.skip = self.skip, 0
            lines = data[int(args["since"]) + skipped:].decode().splitlines()
        return {"rank": rank, "pid": 1003 + rank, "state": "running", "exit_code": None, "path": log_path(node, rank),
                "source": "file", "note": "", "skipped": skipped, "lines": lines, "offset": len(data)}

    def op_stacks(self, args: dict[str, Any]) -> dict[str, Any]:
        node, ranks = self.queried(args)
        return {"ok": True, "node": node, "round": 2, "ranks": [stack(rank) for rank in ranks]}

    def op_goodput(self, args: dict[str, Any]) -> dict[str, Any]:
        return goodput_report()

    def op_ranks(self, args: dict[str, Any]) -> dict[str, Any]:
        def rnd(round_id: int, cause: str, total: float) -> dict[str, Any]:
            start = NOW - 600 + 100 * round_id
            return {"round_id": round_id, "world_size": 4, "cause": cause, "detail": "", "started_at": start,
                    "master_addr": "node-a.example", "master_port": 29500 + round_id,
                    "members": [{"node_id": "a", "group_rank": 0, "host": "node-a.example", "ranks": [0, 1]},
                                {"node_id": "b", "group_rank": 1, "host": "node-b.example", "ranks": [2, 3]}],
                    "timeline": {k: start + v for k, v in timeline(total).items()}}

        return {"ok": True, "round": rnd(2, "failure", 3.4), "history": [rnd(1, "start", 1.2), rnd(2, "failure", 3.4)]}

    def steer(self, args: dict[str, Any], summary: str) -> dict[str, Any]:
        if args.get("dry_run"):
            return {"ok": True, "dry_run": True, "plan": {"summary": summary}}
        return {"ok": True, "accepted": True, "plan": {"summary": summary}}

    def op_drain(self, args: dict[str, Any]) -> dict[str, Any]:
        if args.get("node") == "a" and not args.get("force"):
            raise ClientError("refused", "node a hosts the coordinator; draining it ends the job. Use --force")
        return self.steer(args, "world 4 → 2; ranks 2-3 leave" if args.get("node") == "b" else "world 4 → 2")

    def op_scale(self, args: dict[str, Any]) -> dict[str, Any]:
        return self.steer(args, f"world 4 → {2 * int(args['nodes'])}")

    def op_checkpoint(self, args: dict[str, Any]) -> dict[str, Any]:
        return self.steer(args, "every rank saves at step 243")

    async def events(self, pub: str, since_seq: int | None = None, topics: tuple[str, ...] = ("",),
                     idle_timeout_s: float | None = None) -> AsyncGenerator[Event, None]:
        """Like a daemon's PUB: each of a and b publishes `st.<node>` (every rank of the node), then beats."""
        node = pub.rsplit("/", 1)[-1]
        if node in ("a", "b") and any("st.".startswith(t) or t.startswith("st.") for t in topics):
            for step in range(0, 241, 4):
                ranks = [{"rank": r, "step": step, "loss": loss_at(r, step), "throughput": 128.0, "samples": 8,
                          "step_time": 0.1, "last_step_at": NOW} for r in NODES[node][1]]
                yield Event("st", "steps", node, 17, NOW, {"round": 1 if step < ROUND_2_STEP else 2, "ranks": ranks})
        while node in ("a", "b"):
            yield Event("hb", "heartbeat", node, 17, NOW, {"state": "running", "round": 2})
            await asyncio.sleep(0.5)
        while True:  # c never beats but its socket stays up: the snapshot shows it stale (status says 5 s)
            await asyncio.sleep(3600)

    def close(self) -> None:
        pass


HOSTNAMES = {"a": "gpu-node-017.example.internal", "b": "gpu-node-018.example.internal",
             "c": "gpu-node-117.example.internal"}


def renamed(value: Any, names: dict[str, str]) -> Any:
    """A reply or event body with every node id (a string or a key equal to one) replaced by its new name."""
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, list):
        return [renamed(v, names) for v in value]
    if isinstance(value, dict):
        return {names.get(k, k): renamed(v, names) for k, v in value.items()}
    return value


def hostname_link(names: dict[str, str] = HOSTNAMES) -> Callable[[str], FakeLink]:
    """The fake job with real-cluster node ids (`gpu-node-017.example.internal`) instead of a, b and c."""

    class HostnameLink(FakeLink):
        async def call(self, op: str, timeout_s: float | None = None, **args: Any) -> dict[str, Any]:
            inverse = {new: old for old, new in names.items()}
            return dict(renamed(await super().call(op, timeout_s, **renamed(args, inverse)), names))

        async def events(self, pub: str, since_seq: int | None = None, topics: tuple[str, ...] = ("",),
                         idle_timeout_s: float | None = None) -> AsyncGenerator[Event, None]:
            async for event in super().events(pub, since_seq, topics, idle_timeout_s):
                yield dataclasses.replace(event, node=names.get(event.node, event.node),
                                          body=renamed(event.body, names))

    return HostnameLink

