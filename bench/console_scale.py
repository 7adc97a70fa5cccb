"""Console scale benchmark: N simulated daemons publish heartbeats, steps and events; measure elastic-tui CPU, latency.

Usage: python bench/console_scale.py [--nodes 64 256] [--rate 5] [--seconds 10]
The simulated daemons run in a child process (ROUTER + PUB each on 127.0.0.1, answering hello, status, metrics,
workers, ranks and events); the console runs headless in this process and follows all of them.
CPU is the console process's CPU time over the window (not wall: the host may be shared). Latency is from a
step message's publish time (envelope ts) to the model (model) and to the first frame written after the redraw
that took it (screen).
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
    """N daemons of one job `bench` in one asyncio loop; node i runs global rank i.

    Each publishes like the real daemon (docs/protocol.md §6): `st.<node>` (op `steps`, every rank of the node in
    one message) at most every 0.25 s and only when a step moved, `hb.<node>` every second, and every job event
    (`ev.<node>.<kind>`, numbered by the coordinator) on every PUB.
    """

    def __init__(self, count: int, rate_hz: float, event_every_s: float = 2.0) -> None:
        self.addrs: list[tuple[str, str]] = []
        self.count, self.rate_hz, self.event_every_s = count, rate_hz, event_every_s
        self.ctx = zmq.asyncio.Context()
        self.started = time.time()
        self.pubs: list[zmq.asyncio.Socket] = []
        self.events: list[dict[str, Any]] = []
        self.saved: dict[int, tuple[int, float]] = {}

    @property
    def seq(self) -> int:
        return len(self.events)

    def step_of(self, index: int, now: float) -> tuple[int, float]:
        """The rank's step and when it was taken: `rate_hz` steps a second, the ranks out of phase."""
        elapsed = max(0.0, now - self.started - index / self.count / self.rate_hz)
        step = int(elapsed * self.rate_hz)
        return step, self.started + index / self.count / self.rate_hz + step / self.rate_hz

    def rank(self, index: int, now: float) -> dict[str, Any]:
        step, at = self.step_of(index, now)
        return {"rank": index, "step": step, "loss": 1.0 / (1 + step), "throughput": 100.0, "samples": 8,
                "step_time": 1.0 / self.rate_hz, "last_step_at": at}

    def status(self) -> dict[str, Any]:
        nodes = [{"node_id": f"n{i:03d}", "host": "127.0.0.1", "nproc": 1, "role": "active", "status": "alive",
                  "control": c, "pub": p, "last_seen_age_s": 0.3} for i, (c, p) in enumerate(self.addrs)]
        return {"ok": True, "job_id": "bench", "state": "running", "reason": "", "round": 1,
                "world_size": len(nodes), "min_nodes": 1, "max_nodes": len(nodes), "target": len(nodes),
                "coordinator": "n000", "restarts": {"failure": 0, "membership": 0, "operator": 0, "hang": 0},
                "max_restarts": 3, "last_recovery": {}, "seq": self.seq, "nodes": nodes,
                "rank_map": [{"node_id": n["node_id"], "group_rank": i, "host": "127.0.0.1", "ranks": [i]}
                             for i, n in enumerate(nodes)]}

    def answer(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        if op == "hello":
            return {"ok": True, "job_id": "bench", "node": "n000"}
        if op == "status":
            return self.status()
        if op == "metrics":
            rows = []
            for i in range(self.count):
                row = {**self.rank(i, now), "node": f"n{i:03d}", "round": 1, "dropped": 0, "checkpoint_step": None,
                       "checkpoint_path": None, "checkpoint_bytes": None, "checkpoint_duration_s": None,
                       "checkpoint_age_s": None}
                row["step_age_s"] = now - row.pop("last_step_at")
                if i in self.saved:
                    row["checkpoint_step"], row["checkpoint_age_s"] = self.saved[i][0], now - self.saved[i][1]
                    row["checkpoint_path"] = f"/ckpt/step-{self.saved[i][0]}/rank-{i}.pt"
                rows.append(row)
            return {"ok": True, "ranks": rows}
        if op == "events":
            since, limit = int(args.get("since_seq") or 0), int(args.get("limit", 100))
            found = [e for e in self.events if e["seq"] > since]
            return {"ok": True, "events": found[-limit:] if limit else found, "seq": self.seq}
        if op == "ranks":
            return {"ok": True, "round": None, "history": []}
        if op == "workers":
            return {"ok": True, "nodes": {}}
        return {"ok": False, "code": "unknown_op", "reason": op, "errno": 3}

    async def serve(self, router: zmq.asyncio.Socket) -> None:
        while True:
            ident, frame = await router.recv_multipart()
            env = decode(frame)
            body = self.answer(env.op, env.body)
            await router.send_multipart([ident, encode(Envelope("rep", env.op, body, id=env.id))])

    async def publish(self, index: int, pub: zmq.asyncio.Socket) -> None:
        """Like the daemon's publish_steps and heartbeat: steps at most every 0.25 s when one moved; hb at 1 Hz."""
        node, next_hb, sent_step = f"n{index:03d}", 0.0, -1
        await asyncio.sleep(random.random())
        while True:
            now = time.time()
            if now >= next_hb:
                env = Envelope("hb", "heartbeat", {"state": "running", "round": 1, "job_state": None,
                                                   "coordinator": index == 0}, node=node, seq=self.seq, ts=now)
                await pub.send_multipart([f"hb.{node}".encode(), encode(env)])
                next_hb = now + 1.0
            rank = self.rank(index, now)
            if rank["step"] != sent_step:
                sent_step = rank["step"]
                env = Envelope("st", "steps", {"round": 1, "ranks": [rank]}, node=node, seq=self.seq, ts=now)
                await pub.send_multipart([f"st.{node}".encode(), encode(env)])
            await asyncio.sleep(0.25)

    async def emit_events(self) -> None:
        """A periodic checkpoint of a random rank every `event_every_s`, published on every daemon's PUB."""
        while True:
            await asyncio.sleep(self.event_every_s)
            now, rank = time.time(), random.randrange(self.count)
            step = self.step_of(rank, now)[0]
            self.saved[rank] = (step, now)
            event = {"seq": self.seq + 1, "ts": now, "kind": "checkpoint_saved", "node": f"n{rank:03d}",
                     "rank": rank, "step": step, "path": f"/ckpt/step-{step}/rank-{rank}.pt", "bytes": 48_000_000,
                     "duration_s": 0.5, "request_id": None}
            self.events.append(event)
            frame = encode(Envelope("ev", "checkpoint_saved", event, node=event["node"], seq=event["seq"], ts=now))
            for pub in self.pubs:
                await pub.send_multipart([f"ev.{event['node']}.checkpoint_saved".encode(), frame])

    async def run(self) -> None:
        tasks = []
        for index in range(self.count):
            router, pub = self.ctx.socket(zmq.ROUTER), self.ctx.socket(zmq.PUB)
            ports = router.bind_to_random_port("tcp://127.0.0.1"), pub.bind_to_random_port("tcp://127.0.0.1")
            self.addrs.append((f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}"))
            self.pubs.append(pub)
            tasks += [asyncio.create_task(self.serve(router)), asyncio.create_task(self.publish(index, pub))]
        tasks.append(asyncio.create_task(self.emit_events()))
        print(json.dumps(self.addrs[0]), flush=True)
        await asyncio.gather(*tasks)


async def measure(control: str, pub: str, count: int, seconds: float) -> dict[str, float]:
    from tui.app import ElasticApp

    app = ElasticApp({"bench": [control]}, seed_pubs={control: pub})
    model_lat: list[float] = []
    screen_lat: list[float] = []
    applied: list[float] = []  # publish times (envelope ts) of steps folded into the model, not yet redrawn
    drawn: list[float] = []  # ... redrawn into the widgets, not yet on screen
    recording = False
    session = app.sessions["bench"]
    apply_steps, redraw, display = session.model.apply_steps, app.redraw, app._display

    def timed_steps(node_id: str, body: dict[str, Any], sent: float | None = None) -> None:
        apply_steps(node_id, body, sent)
        if recording and sent:
            model_lat.append(time.time() - sent)
            applied.append(sent)

    def timed_redraw() -> None:
        redraw()
        drawn.extend(applied)
        applied.clear()

    def timed_display(screen: Any, renderable: Any) -> None:
        """A frame written to the (headless) terminal: what was redrawn before it is now on screen."""
        display(screen, renderable)
        now = time.time()
        if recording and renderable is not None:
            screen_lat.extend(now - sent for sent in drawn)
        if renderable is not None:
            drawn.clear()

    session.model.apply_steps = timed_steps  # type: ignore[method-assign]
    app.redraw = timed_redraw  # type: ignore[method-assign]
    app._display = timed_display  # type: ignore[method-assign]
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
    print(f"console_scale: {os.cpu_count()} cores; {args.rate:g} steps/s per daemon, st.<node> at <= 4 Hz + "
          f"1 heartbeat/s + a job event every 2 s; "
          f"{args.seconds:g} s window; console headless at 120x36 on the nodes view")
    print(f"{'daemons':>8} {'live':>5} {'msgs/s':>7} {'console CPU %':>14} {'model p50/p99 ms':>17} "
          f"{'screen p50/p99 ms':>18}")
    results = []
    for count in args.nodes:
        r = run_case(count, args.rate, args.seconds)
        results.append({"daemons": count, **r})
        print(f"{count:>8} {int(r['live']):>5} {count * (min(args.rate, 4.0) + 1):>7.0f} {r['cpu_pct']:>14.1f} "
              f"{r['model_p50']:>8.1f}/{r['model_p99']:<8.1f} {r['screen_p50']:>8.1f}/{r['screen_p99']:<9.1f}")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
