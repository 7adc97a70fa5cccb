"""Console scale benchmark: N simulated daemons publish heartbeats, steps and events; measure elastic-tui CPU, latency.

Usage: python bench/console_scale.py [--nodes 256 2048] [--rate 5] [--seconds 10] [--scroll-every 0]
The simulated daemons run in a child process (ROUTER + XPUB each on 127.0.0.1, answering hello, status with
pages and node_counts, metrics, workers, ranks and events); the console runs headless in this process. Above 64
nodes it follows the job through `status` pages and subscribes only to the daemons on screen and the coordinator.
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

from elasticd.wire.protocol import Envelope, decode, encode

TICK_S = 0.05  # the publishing loop's period; each daemon checks its step every 0.25 s, as the real one
STRAGGLERS = 3  # nodes 1..3 are named stragglers in `status`: their rows are marked SLOW
STRAGGLER = {"wait_s": 0.001, "others_wait_s": 0.05, "cost_s_per_step": 0.049, "step_time_s": 0.2, "since": 0.0}


class FakeDaemons:
    """N daemons of one job `bench` in one asyncio loop; node i runs global rank i; node 0 is the coordinator.

    Each publishes like the real daemon (docs/protocol.md §6): `st.<node>/` (op `steps`, every rank of the node in
    one message) at most every 0.25 s and only when a step moved, `hb.<node>/` every second; job events
    (`ev.<node>/<kind>`) only on the coordinator's PUB. Every socket is bound, but a PUB is an XPUB here: a daemon
    nobody subscribes to encodes nothing (a real one would publish and its PUB drop the messages unsent), so
    2,048 of them cost the machine only what the console asks for.
    """

    def __init__(self, count: int, rate_hz: float, event_every_s: float = 2.0) -> None:
        self.addrs: list[tuple[str, str]] = []
        self.count, self.rate_hz, self.event_every_s = count, rate_hz, event_every_s
        self.ctx = zmq.asyncio.Context()
        self.ctx.setsockopt(zmq.LINGER, 0)
        self.ctx.set(zmq.MAX_SOCKETS, 4 * count + 64)
        self.started = time.time()
        self.pubs: list[zmq.asyncio.Socket] = []
        self.listened: dict[int, set[bytes]] = {}  # node index -> topics its PUB has subscribers for
        self.events: list[dict[str, Any]] = []
        self.saved: dict[int, tuple[int, float]] = {}
        self.ids = [f"n{i:04d}" for i in range(count)]

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

    def node(self, index: int) -> dict[str, Any]:
        control, pub = self.addrs[index]
        return {"node_id": self.ids[index], "host": "127.0.0.1", "nproc": 1, "role": "active", "status": "alive",
                "control": control, "pub": pub, "last_seen_age_s": 0.3, "workers": []}

    def status(self, args: dict[str, Any]) -> dict[str, Any]:
        """The summary, and the page of nodes asked for (`nodes_offset`, `nodes_limit`; all by default)."""
        offset, limit = int(args.get("nodes_offset") or 0), args.get("nodes_limit")
        end = self.count if limit is None else min(self.count, offset + int(limit))
        return {"ok": True, "job_id": "bench", "state": "running", "reason": "", "round": 1,
                "world_size": self.count, "min_nodes": 1, "max_nodes": self.count, "target": self.count,
                "coordinator": self.ids[0], "restarts": {"failure": 0, "membership": 0, "operator": 0, "hang": 0},
                "max_restarts": 3, "last_recovery": {}, "seq": self.seq,
                "nodes": [self.node(i) for i in range(offset, end)], "nodes_total": self.count,
                "nodes_offset": offset, "node_counts": {"alive/active": self.count},
                "rank_map": [{"node_id": n, "group_rank": i, "host": "127.0.0.1", "ranks": [i]}
                             for i, n in enumerate(self.ids)],
                "goodput": 0.9392, "stragglers": {n: STRAGGLER for n in self.ids[1:STRAGGLERS + 1]}}

    def goodput(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        """A job an hour old that lost a minute at each of six restarts; the nodes asked for, the lowest first."""
        bins = [{"training": 120.0 - 60.0 * (i % 5 == 2), **({"recovery.crash": 60.0} if i % 5 == 2 else {})}
                for i in range(30)]
        life = {"training": 3240.0, "checkpoint": 0.0, "redone": 0.0, "waiting": 0.0,
                "recovery": {"crash": 360.0}, "accounted_s": 3600.0, "training_share": 0.9}
        shown = self.count if int(args.get("nodes", 20)) < 0 else min(self.count, int(args.get("nodes", 20)))
        nodes = [{"node": self.ids[i], "goodput": 0.9, "seconds": 3600.0, "idle": 0.0,
                  "lost": {"recovery.crash": 360.0}} for i in range(shown)]
        return {"ok": True, "goodput": 0.9, "redone_steps": 0, "wall_s": 3600.0, "life": life,
                "window": {**life, "seconds": 3600.0}, "nodes": nodes, "idle_node_s": 0.0,
                "timeline": {"start": now - 3600.0, "width_s": 120.0, "bins": bins}}

    def answer(self, index: int, op: str, args: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        if op == "hello":
            return {"ok": True, "job_id": "bench", "node": self.ids[index], "coordinator": index == 0,
                    "control": self.addrs[index][0], "pub": self.addrs[index][1], "events_pub": self.addrs[0][1]}
        if op == "status":
            return self.status(args)
        if op == "metrics":
            rows = []
            for i in range(self.count):
                row = {**self.rank(i, now), "node": self.ids[i], "round": 1, "dropped": 0, "checkpoint_step": None,
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
            return {"ok": True, "events": found[-limit:] if limit > 0 else found, "seq": self.seq}
        if op == "ranks":
            return {"ok": True, "round": None, "history": []}
        if op == "goodput":
            return self.goodput(args, now)
        if op == "workers":
            return {"ok": True, "nodes": {}}
        return {"ok": False, "code": "unknown_op", "reason": op, "errno": 3}

    async def serve(self, index: int, router: zmq.asyncio.Socket) -> None:
        while True:
            ident, frame = await router.recv_multipart()
            env = decode(frame)
            body = self.answer(index, env.op, env.body)
            await router.send_multipart([ident, encode(Envelope("rep", env.op, body, id=env.id))])

    async def watch(self, index: int, pub: zmq.asyncio.Socket) -> None:
        """Subscriptions to this daemon's PUB come and go as the console scrolls."""
        while True:
            message = await pub.recv()
            topics = self.listened.setdefault(index, set())
            (topics.add if message[:1] == b"\x01" else topics.discard)(message[1:])
            if not topics:
                del self.listened[index]

    async def publish(self) -> None:
        """Like each daemon's publish_steps and heartbeat: steps every 0.25 s when one moved; hb at 1 Hz."""
        next_st = [random.random() * 0.25 for _ in range(self.count)]
        next_hb = [random.random() for _ in range(self.count)]
        sent_step = [-1] * self.count
        while True:
            now = time.time()
            elapsed = now - self.started
            for index in list(self.listened):
                node, pub = self.ids[index], self.pubs[index]
                if elapsed >= next_hb[index]:
                    env = Envelope("hb", "heartbeat", {"state": "running", "round": 1, "job_state": None,
                                                       "coordinator": index == 0}, node=node, seq=self.seq, ts=now)
                    await pub.send_multipart([f"hb.{node}/".encode(), encode(env)])
                    next_hb[index] = elapsed + 1.0
                if elapsed >= next_st[index]:
                    next_st[index] = elapsed + 0.25
                    rank = self.rank(index, now)
                    if rank["step"] != sent_step[index]:
                        sent_step[index] = rank["step"]
                        env = Envelope("st", "steps", {"round": 1, "ranks": [rank]}, node=node, seq=self.seq, ts=now)
                        await pub.send_multipart([f"st.{node}/".encode(), encode(env)])
            await asyncio.sleep(TICK_S)

    async def emit_events(self) -> None:
        """A periodic checkpoint of a random rank every `event_every_s`, published on the coordinator's PUB."""
        while True:
            await asyncio.sleep(self.event_every_s)
            now, rank = time.time(), random.randrange(self.count)
            step = self.step_of(rank, now)[0]
            self.saved[rank] = (step, now)
            event = {"seq": self.seq + 1, "ts": now, "kind": "checkpoint_saved", "node": self.ids[rank],
                     "rank": rank, "step": step, "path": f"/ckpt/step-{step}/rank-{rank}.pt", "bytes": 48_000_000,
                     "duration_s": 0.5, "request_id": None}
            self.events.append(event)
            frame = encode(Envelope("ev", "checkpoint_saved", event, node=event["node"], seq=event["seq"], ts=now))
            await self.pubs[0].send_multipart([f"ev.{event['node']}/checkpoint_saved".encode(), frame])

    async def run(self) -> None:
        tasks = []
        for index in range(self.count):
            router, pub = self.ctx.socket(zmq.ROUTER), self.ctx.socket(zmq.XPUB)
            ports = router.bind_to_random_port("tcp://127.0.0.1"), pub.bind_to_random_port("tcp://127.0.0.1")
            self.addrs.append((f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}"))
            self.pubs.append(pub)
            tasks += [asyncio.create_task(self.serve(index, router)), asyncio.create_task(self.watch(index, pub))]
        tasks += [asyncio.create_task(self.publish()), asyncio.create_task(self.emit_events())]
        print(json.dumps(self.addrs[0]), flush=True)
        await asyncio.gather(*tasks)


def on_screen(app: Any) -> list[str]:
    """The nodes the console follows: every node of a small job; the rows on screen of a paged one."""
    session = app.sessions["bench"]
    return session.shown_nodes() if session.model.paged else list(session.model.nodes)


def all_live(app: Any, count: int) -> bool:
    model, shown = app.model, on_screen(app)
    wanted = len(shown) if model.paged else count
    return model.nodes_total == count and len(shown) == wanted > 0 and all(
        model.node_liveness(model.nodes[n]) == "live" for n in shown)


async def measure(control: str, pub: str, count: int, seconds: float, scroll_every_s: float,
                  view: str = "nodes") -> dict[str, float]:
    import tui.feeds
    from tui.app import ElasticApp

    app = ElasticApp({"bench": [control]}, seed_pubs={control: pub})
    model_lat: list[float] = []
    screen_lat: list[float] = []
    applied: list[float] = []  # publish times (envelope ts) of steps folded into the model, not yet redrawn
    drawn: list[float] = []  # ... redrawn into the widgets, not yet on screen
    received = [0]  # telemetry messages folded into the model while recording
    recording = False
    session = app.sessions["bench"]
    apply_steps, redraw, display, ingest = session.model.apply_steps, app.redraw, app._display, tui.feeds.ingest

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

    def counted_ingest(session: Any, event: Any) -> None:
        received[0] += recording
        ingest(session, event)

    session.model.apply_steps = timed_steps  # type: ignore[method-assign]
    app.redraw = timed_redraw  # type: ignore[method-assign]
    app._display = timed_display  # type: ignore[method-assign]
    tui.feeds.ingest = counted_ingest  # type: ignore[assignment]
    async with app.run_test(headless=True, size=(120, 36)) as pilot:
        deadline = time.monotonic() + 90
        while not all_live(app, count):
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(app.model.nodes)} of {count} daemons known (not all live) after 90 s")
            await pilot.pause(0.2)
        app.switch_view(view)
        await pilot.pause(2.0)
        recording = True
        cpu0, wall0 = time.process_time(), time.monotonic()
        while time.monotonic() - wall0 < seconds:
            await asyncio.sleep(min(scroll_every_s or seconds, seconds - (time.monotonic() - wall0)))
            if scroll_every_s:  # a page down: the console fetches that page and follows its daemons instead
                app.nodes_table.action_cursor_page(1)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        recording = False
        followed = len(on_screen(app))
        live = sum(1 for n in on_screen(app) if app.model.node_liveness(app.model.nodes[n]) == "live")
    tui.feeds.ingest = ingest
    return {"cpu_pct": 100 * cpu / wall, "steps": len(model_lat), "live": live, "followed": followed,
            "msgs_per_s": received[0] / wall, "model_p50": pct(model_lat, 50), "model_p99": pct(model_lat, 99),
            "screen_p50": pct(screen_lat, 50), "screen_p99": pct(screen_lat, 99)}


def pct(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return 1000 * values[0]
    return 1000 * statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def run_case(count: int, rate: float, seconds: float, scroll_every_s: float = 0.0,
             view: str = "nodes") -> dict[str, float]:
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(count), "--rate", str(rate)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        control, pub = json.loads(child.stdout.readline())
        return asyncio.run(measure(control, pub, count, seconds, scroll_every_s, view))
    finally:
        child.kill()
        child.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[64, 256, 2048])
    parser.add_argument("--rate", type=float, default=5.0, help="steps per second per daemon")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--scroll-every", type=float, default=0.0, help="seconds between page downs (0: none)")
    parser.add_argument("--view", default="nodes", choices=("nodes", "goodput"),
                        help="the view on screen (goodput: the lost-time plot, redrawn at each poll)")
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(FakeDaemons(args.serve, args.rate).run())
        return 0
    print(f"console_scale: {os.cpu_count()} cores; {args.rate:g} steps/s per daemon, st.<node>/ at <= 4 Hz + "
          f"1 heartbeat/s + a job event every 2 s; {args.seconds:g} s window; console headless at 120x36 on the "
          f"{args.view} view" + (f", a page down every {args.scroll_every:g} s" if args.scroll_every else ""))
    print(f"{'daemons':>8} {'followed':>8} {'live':>5} {'msgs/s in':>9} {'console CPU %':>14} "
          f"{'model p50/p99 ms':>17} {'screen p50/p99 ms':>18}")
    results = []
    for count in args.nodes:
        r = run_case(count, args.rate, args.seconds, args.scroll_every, args.view)
        results.append({"daemons": count, **r})
        print(f"{count:>8} {int(r['followed']):>8} {int(r['live']):>5} {r['msgs_per_s']:>9.0f} {r['cpu_pct']:>14.1f} "
              f"{r['model_p50']:>8.1f}/{r['model_p99']:<8.1f} {r['screen_p50']:>8.1f}/{r['screen_p99']:<9.1f}")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
