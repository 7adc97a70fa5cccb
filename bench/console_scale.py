"""Console scale benchmark: N simulated daemons publish heartbeats and steps; measure elastic-tui CPU and latency.

Usage: python bench/console_scale.py [--nodes 64 256] [--rate 5] [--seconds 10]
The simulated daemons run in a child process (ROUTER + PUB each on 127.0.0.1, answering hello, status, metrics,
workers, ranks and events); the console runs headless in this process and follows all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zmq
import zmq.asyncio

from elasticd.protocol import Envelope, decode, encode


class FakeDaemons:
    """N daemons of one job `bench` in one asyncio loop; node i runs global rank i."""

    def __init__(self, count: int, rate_hz: float) -> None:
        self.addrs: list[tuple[str, str]] = []
        self.count, self.rate_hz = count, rate_hz
        self.ctx = zmq.asyncio.Context()
        self.steps = [0] * count
        self.started = time.time()

    def status(self) -> dict[str, Any]:
        nodes = [{"node_id": f"n{i:03d}", "host": "127.0.0.1", "nproc": 1, "role": "active", "status": "alive",
                  "control": c, "pub": p, "last_seen_age_s": 0.3} for i, (c, p) in enumerate(self.addrs)]
        return {"ok": True, "job_id": "bench", "state": "running", "reason": "", "round": 1,
                "world_size": len(nodes), "min_nodes": 1, "max_nodes": len(nodes), "target": len(nodes),
                "coordinator": "n000", "restarts": {"failure": 0, "membership": 0, "operator": 0, "hang": 0},
                "max_restarts": 3, "last_recovery": {}, "seq": 1, "nodes": nodes,
                "rank_map": [{"node_id": n["node_id"], "group_rank": i, "host": "127.0.0.1", "ranks": [i]}
                             for i, n in enumerate(nodes)]}

    def answer(self, op: str) -> dict[str, Any]:
        if op == "hello":
            return {"ok": True, "job_id": "bench", "node": "n000"}
        if op == "status":
            return self.status()
        if op == "metrics":
            return {"ok": True, "ranks": [{"node": f"n{i:03d}", "rank": i, "step": s, "loss": 1.0 / (1 + s),
                                           "throughput": 100.0} for i, s in enumerate(self.steps)]}
        if op == "events":
            return {"ok": True, "events": [], "seq": 1}
        if op == "ranks":
            return {"ok": True, "round": None, "history": []}
        if op == "workers":
            return {"ok": True, "nodes": {}}
        return {"ok": False, "code": "unknown_op", "reason": op, "errno": 3}

    async def serve(self, router: zmq.asyncio.Socket) -> None:
        while True:
            ident, frame = await router.recv_multipart()
            env = decode(frame)
            body = self.answer(env.op)
            await router.send_multipart([ident, encode(Envelope("rep", env.op, body, id=env.id))])

    async def publish(self, index: int, pub: zmq.asyncio.Socket) -> None:
        node, next_hb = f"n{index:03d}", 0.0
        await asyncio.sleep(random.random())
        while True:
            now = time.time()
            if now >= next_hb:
                env = Envelope("hb", "heartbeat", {"state": "running", "round": 1}, node=node, seq=1, ts=now)
                await pub.send_multipart([f"hb.{node}".encode(), encode(env)])
                next_hb = now + 1.0
            self.steps[index] += 1
            step = self.steps[index]
            body = {"rank": index, "step": step, "loss": 1.0 / (1 + step), "throughput": 100.0, "sent": time.time()}
            await pub.send_multipart([f"st.{node}.step".encode(), encode(Envelope("st", "step", body, node=node))])
            await asyncio.sleep(1.0 / self.rate_hz)

    async def run(self) -> None:
        tasks = []
        for index in range(self.count):
            router, pub = self.ctx.socket(zmq.ROUTER), self.ctx.socket(zmq.PUB)
            ports = router.bind_to_random_port("tcp://127.0.0.1"), pub.bind_to_random_port("tcp://127.0.0.1")
            self.addrs.append((f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}"))
            tasks += [asyncio.create_task(self.serve(router)), asyncio.create_task(self.publish(index, pub))]
        print(json.dumps(self.addrs[0]), flush=True)
        await asyncio.gather(*tasks)


async def measure(control: str, pub: str, count: int, seconds: float) -> dict[str, float]:
    from tui.app import ElasticApp

    app = ElasticApp({"bench": [control]}, seed_pubs={control: pub})
    model_lat: list[float] = []
    screen_lat: list[float] = []
    pending: list[float] = []
    recording = False
    session = app.sessions["bench"]
    apply_step, redraw = session.model.apply_step, app.redraw

    def timed_step(node_id: str, body: dict[str, Any]) -> None:
        apply_step(node_id, body)
        if recording and "sent" in body:
            model_lat.append(time.time() - body["sent"])
            pending.append(body["sent"])

    def timed_redraw() -> None:
        redraw()
        now = time.time()
        if recording:
            screen_lat.extend(now - sent for sent in pending)
        pending.clear()

    session.model.apply_step = timed_step  # type: ignore[method-assign]
    app.redraw = timed_redraw  # type: ignore[method-assign]
    async with app.run_test(headless=True, size=(120, 36)) as pilot:
        deadline = time.monotonic() + 60
        while sum(1 for n in app.model.nodes.values() if app.model.node_liveness(n) == "live") < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(app.model.nodes)} of {count} daemons live after 60 s")
            await pilot.pause(0.2)
        await pilot.pause(2.0)
        recording = True
        cpu0, wall0 = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        recording = False
        live = sum(1 for n in app.model.nodes.values() if app.model.node_liveness(n) == "live")
    return {"cpu_pct": 100 * cpu / wall, "steps": len(model_lat), "live": live,
            "model_p50": pct(model_lat, 50), "model_p99": pct(model_lat, 99),
            "screen_p50": pct(screen_lat, 50), "screen_p99": pct(screen_lat, 99)}


def pct(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    return 1000 * statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def run_case(count: int, rate: float, seconds: float) -> dict[str, float]:
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(count), "--rate", str(rate)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        control, pub = json.loads(child.stdout.readline())
        return asyncio.run(measure(control, pub, count, seconds))
    finally:
        child.kill()
        child.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rate", type=float, default=5.0, help="steps per second per daemon")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(FakeDaemons(args.serve, args.rate).run())
        return 0
    print(f"console_scale: {os.cpu_count()} cores; {args.rate:g} steps/s per daemon + 1 heartbeat/s; "
          f"{args.seconds:g} s window; console headless at 120x36 on the nodes view")
    print(f"{'daemons':>8} {'live':>5} {'msgs/s':>7} {'console CPU %':>14} {'model p50/p99 ms':>17} "
          f"{'screen p50/p99 ms':>18}")
    results = []
    for count in args.nodes:
        r = run_case(count, args.rate, args.seconds)
        results.append({"daemons": count, **r})
        print(f"{count:>8} {int(r['live']):>5} {count * (args.rate + 1):>7.0f} {r['cpu_pct']:>14.1f} "
              f"{r['model_p50']:>8.1f}/{r['model_p99']:<8.1f} {r['screen_p50']:>8.1f}/{r['screen_p99']:<9.1f}")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
