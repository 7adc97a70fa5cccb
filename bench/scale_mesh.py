"""Coordinator scale, real daemon: one `elasticd start` coordinator and N-1 simulated members on real sockets.

`bench/scale_mesh.py --nodes 256,1024,2048 --out bench/results/scale-mesh.json` starts, per N, the real
coordinator daemon (tests/support/workers/ticker.py as its 8 workers, `--preload json`), then N-1 fake members
(bench/mesh_members.py) in child processes of this one, each on the daemon's own MemberMesh. It reports the
time from the last welcome to the first round settled (every member has it and `go`, and the coordinator its
`round_complete`: each phase's CPU ends with its own work), the coordinator daemon's CPU seconds (psutil, its pid
only) for the formation, a join, a drain (`drain` verb) and a node loss (a member's daemon gone: its sockets
closed), false `node_lost` events, steady CPU % over 10 s, and `status` round trips with and without
`--nodes-limit 50`. The job has relays as a real one of that size would (`--rdzv-conf` defaults: groups of 32
from 256 nodes); `--relay-group 0` runs it without them, every member on its own link to the coordinator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # bench -> tests, never the reverse
from mesh_members import Fleets
from procs import CpuMeter
from scale_sim import cpu_model
from support.harness import TICKER, DaemonProc, free_port

from elasticd.client import Client
from elasticd.job.config import JobConfig
from elasticd.mesh.member_mesh import RETIRE_S
from elasticd.wire.names import EventKind
from elasticd.wire.protocol import decode

WORKERS = 8
STEADY_S = 10.0
SETTLE_TIMEOUT_S = 300.0
COORD = "coord"
TAIL_S = 0.5  # a phase's CPU window: its wall time plus this


def net_of_steady(phase: dict[str, Any], steady_pct: float) -> float:
    """A phase's CPU less the heartbeats that the same window costs anyway (at the steady rate)."""
    return round(phase["coordinator_cpu_s"] - steady_pct / 100 * (phase["wall_s"] + TAIL_S), 3)


class Bench:
    """One N: the daemon, the fleet, and the coordinator's CPU between marks."""

    def __init__(self, nodes: int, tmp: Path, relay_group: int | None) -> None:
        self.nodes, self.port = nodes, free_port()
        env = {**os.environ, "ELASTICD_RUNTIME_DIR": str(tmp / "run"), "PYTHONUNBUFFERED": "1"}
        conf = [] if relay_group is None else ["--rdzv-conf", f"relay_group={relay_group}"]
        self.daemon = DaemonProc(["--nnodes", f"{nodes}:{nodes + 1}", "--nproc-per-node", str(WORKERS),
                                  "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", f"mesh{self.port}",
                                  "--node-id", COORD, "--log-dir", str(tmp / "logs"), "--preload", "json", *conf,
                                  str(TICKER), "--interval", "1"], tmp, env)
        self.daemon.wait_line(r"elasticd \S+: node ")
        self.meter = CpuMeter(self.daemon.proc.pid)
        relays = relay_group != 0 and nodes + 1 >= JobConfig.relay_from
        self.fleet = Fleets(f"tcp://127.0.0.1:{self.port}", WORKERS, relays, nodes)
        self.ctx = zmq.asyncio.Context()
        self.complete: set[int] = set()  # rounds whose round_complete the coordinator published

    async def call(self, op: str, **args: Any) -> tuple[dict[str, Any], float]:
        def blocking() -> tuple[dict[str, Any], float]:
            with Client(self.daemon.control, timeout_s=60) as client:
                start = time.perf_counter()
                reply = client.call(op, **args)
                return reply, time.perf_counter() - start
        return await asyncio.to_thread(blocking)

    async def settle(self, after: int) -> int:
        """Wait until a round newer than `after` reached every member and the coordinator has every member's
        report of it (its `round_complete`): the next phase's CPU must not include this one's tail."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            newest = (await asyncio.to_thread(self.fleet.summary))["min_round"]
            if newest > after and (await asyncio.to_thread(self.fleet.summary, newest))["settled"]:
                break
        else:
            raise TimeoutError(f"no round after {after} settled within {SETTLE_TIMEOUT_S:.0f}s")
        round_id = newest
        while round_id not in self.complete:  # from the coordinator's PUB: polling `events` would cost it CPU
            if self.follow.done():
                self.follow.result()  # its error, if it failed
            if time.monotonic() > deadline:
                raise TimeoutError(f"round {round_id} reached every member but the coordinator has no round_complete")
            await asyncio.sleep(0.02)
        return round_id

    async def follow_rounds(self) -> None:
        """The coordinator's `round_complete` events, as a console would get them."""
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, f"ev.{COORD}/{EventKind.round_complete}".encode())
        sub.connect(self.daemon.pub)
        try:
            while True:
                _topic, frame = await sub.recv_multipart()
                self.complete.add(int(decode(frame, from_daemon=True).body["round"]))
        finally:
            sub.close(linger=0)

    async def phase(self, change: Callable[[], Awaitable[Any]], before: int) -> dict[str, Any]:
        self.meter.take()
        start = time.perf_counter()
        await change()
        round_id = await self.settle(before)
        elapsed = time.perf_counter() - start
        await asyncio.sleep(TAIL_S)  # the coordinator's part after the last `go`: round_complete, events
        return {"round": round_id, "wall_s": round(elapsed, 3), "coordinator_cpu_s": self.meter.take()}

    async def run(self) -> dict[str, Any]:
        self.follow = asyncio.create_task(self.follow_rounds())
        result: dict[str, Any] = {"nodes": self.nodes, "workers": self.nodes * WORKERS}
        self.meter.take()
        start = time.perf_counter()
        self.fleet.add([f"sim-{i:05d}" for i in range(self.nodes - 1)])
        first = await self.settle(0)
        last_welcome = self.fleet.summary()["welcomed_at"]
        result["formation"] = {"round": first, "wall_s": round(time.perf_counter() - start, 3),
                               "first_round_after_last_registration_s": round(time.time() - last_welcome, 3)}
        # Members that took a relay leave their direct link RETIRE_S later: the formation's own tail, not the join's.
        await asyncio.sleep(RETIRE_S + TAIL_S)
        result["formation"]["coordinator_cpu_s"] = self.meter.take()
        ids = list(self.fleet.ids)

        async def join() -> None:
            self.fleet.add(["newcomer"])

        async def drain() -> None:
            await self.call("drain", node=ids[-1])

        async def loss() -> None:
            self.fleet.close(ids[3])

        current = first
        for name, change in (("join", join), ("drain", drain), ("node_loss", loss)):
            if change is loss:  # (read before the phase: a full `status` is CPU of the coordinator's too)
                nodes = (await self.call("status"))[0]["nodes"]
                lost = {"relayed_for": sum(n["via"] == ids[3] for n in nodes),
                        "via": next(n["via"] for n in nodes if n["node_id"] == ids[3])}
            result[name] = await self.phase(change, current)
            current = result[name]["round"]
        result["node_loss"]["lost_node"] = lost  # a relay (for how many members), or a member behind one
        await asyncio.sleep(2.0)
        self.meter.take()
        await asyncio.sleep(STEADY_S)
        result["steady_cpu_pct"] = round(100 * self.meter.take() / STEADY_S, 1)
        for name in ("join", "drain", "node_loss"):
            result[name]["net_of_steady_cpu_s"] = net_of_steady(result[name], result["steady_cpu_pct"])
        summary = [await self.call("status", nodes_limit=50) for _ in range(3)]
        result["status_summary_s"] = round(min(t for _, t in summary), 4)
        result["relays"] = summary[0][0]["relays"]
        result["status_full_s"] = round(min([(await self.call("status"))[1] for _ in range(3)]), 4)
        events = (await self.call("events", kinds=[EventKind.node_lost], limit=0))[0]["events"]
        result["false_node_lost"] = sum(1 for e in events if e["node"] != ids[3])
        result["node_lost"] = [f"{e['node']}: {e.get('reason', '')}" for e in events]
        result["rounds"] = current
        result["load_average"] = [round(x, 1) for x in os.getloadavg()]
        self.follow.cancel()
        return result

    def close(self) -> None:
        self.fleet.stop()
        self.ctx.destroy(linger=0)
        self.daemon.stop()


def run(nodes: int, relay_group: int | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(nodes, Path(tmp), relay_group)
        try:
            return asyncio.run(bench.run())
        finally:
            bench.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="256,1024,2048", help="comma-separated node counts (the daemon included)")
    parser.add_argument("--relay-group", type=int, default=None, help="--rdzv-conf relay_group for the job "
                        "(0: no relays; default: the daemon's)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    runs = []
    for n in args.nodes.split(","):
        runs.append(run(int(n), args.relay_group))
        print(json.dumps(runs[-1]), flush=True)
    report = {"machine": f"{cpu_model()}, {os.cpu_count()} cores (shared)", "runs": runs}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
