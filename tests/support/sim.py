"""An in-process simulator: one Coordinator, N fake members, an in-memory mesh and a fake clock."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from elasticd.commands.registry import REGISTRY
from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.membership import MembershipStore, MemoryStore, Round
from elasticd.job.config import STOP_SLACK_S, JobConfig
from elasticd.job.events import EventLog
from elasticd.member.beats import BeatDiff
from elasticd.member.link import LEAVING_OPS
from elasticd.member.rank_reports import step_answer
from elasticd.wire.names import STEP_WAIT_METRIC, JobState, MeshOp, NodeState
from elasticd.wire.protocol import Envelope, encode

COORD = "coordinator"  # the destination of member -> coordinator messages in the trace
Timer = tuple[float, int, Callable[..., None], tuple[Any, ...]]  # (due, order, fn, args)


def verb(c: Coordinator, op: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """A verb as daemon/control.py runs it at the coordinator: its body decoded into its request, then run."""
    command = REGISTRY[op]
    return command.run(c, command.decode(body or {}))


class FakeClock:
    """Time moves only when the simulator moves it; callable, so it is the coordinator's `clock`."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class Scheduler:
    """Timed callbacks run in (due, order) order.

    A fixed delay gets a FIFO lane: with a monotonic clock each lane stays sorted, so scheduling and popping
    are O(1) (messages, ticks, heartbeats). Any other delay goes to a heap (per-round node timers).
    """

    def __init__(self, clock: FakeClock, lanes: Iterable[float] = ()) -> None:
        self.clock = clock
        self.lanes: dict[float, deque[Timer]] = {d: deque() for d in lanes}
        self.heap: list[Timer] = []
        self.order = itertools.count()

    def add_lane(self, delay: float | None) -> None:
        if delay is not None:
            self.lanes.setdefault(delay, deque())

    def later(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        timer = (self.clock.now + delay, next(self.order), fn, args)
        lane = self.lanes.get(delay)
        if lane is not None:
            lane.append(timer)
        else:
            heapq.heappush(self.heap, timer)

    def run_until(self, until: float) -> None:
        while (timer := self._pop(until)) is not None:
            self.clock.now = max(self.clock.now, timer[0])
            timer[2](*timer[3])
        self.clock.now = max(self.clock.now, until)

    def _pop(self, until: float) -> Timer | None:
        best: Timer | None = None
        source: deque[Timer] | None = None
        for lane in self.lanes.values():  # a handful of lanes: O(1) per event
            if lane and (best is None or lane[0][:2] < best[:2]):
                best, source = lane[0], lane
        if self.heap and (best is None or self.heap[0][:2] < best[:2]):
            best, source = self.heap[0], None
        if best is None or best[0] > until:
            return None
        if source is None:
            return heapq.heappop(self.heap)
        return source.popleft()


@dataclass
class Msg:
    """One mesh message as sent; `order` is shared with recorded events, so the two interleave."""

    order: int
    at: float
    src: str
    dst: str
    op: str
    body: dict[str, Any]


class SimNode:
    """A member daemon plus its node agent, reduced to what the coordinator can observe (member.py, node.py).

    Knobs: `stop_s` (how long old workers take to stop; None: never), `spawn_s`, `shim` with `step0` and
    `step_time` (steps advance with the clock while workers run) and `in_place` (its ranks resize in place: the
    step report says so, and a `resize_workers` is answered as a drain is), `save_s` (a drain's checkpoint),
    `checks_s` (when its first health checks report), `mute` (ops it silently ignores), `delay` (its link latency).
    States: `kill()`, `freeze()`/`thaw()`, `blip()`.
    In a job with relays (`relay_group`, `relay_from`) each offers a relay and sends through the one it is told
    (`via`): a frozen relay holds what its members send until it thaws, a dead one drops it and its members go
    direct at once (their links to it closed), as member_mesh.py does.
    """

    def __init__(self, sim: Sim, node_id: str, nproc: int = 2, *, shim: bool = False, step0: int = 0,
                 step_time: float = 0.1, stop_s: float | None = 0.0, spawn_s: float = 0.0, save_s: float = 0.0,
                 delay: float | None = None, checks_s: float | None = 0.0) -> None:
        self.sim, self.node_id, self.nproc = sim, node_id, nproc
        self.checks_s = checks_s  # its first health checks report this long after its welcome (None: never)
        self.shim, self.step0, self.step_time = shim, step0, step_time
        self.wait_s: float | None = None  # shim ranks that time their allreduce wait report this (stragglers)
        self.in_place = False  # its shim ranks resize in place (trainer_shim.Elastic)
        self.stop_s, self.spawn_s, self.save_s = stop_s, spawn_s, save_s
        self.warm_s = 1.0  # its hot spares' start and rehearsal, before it says `warm`
        self.delay = sim.delay if delay is None else delay
        sim.sched.add_lane(self.delay)
        self.instance = f"{node_id}-1"
        self.mute: set[str] = set()
        self.registered = self.leaving = self.departed = self.killed = self.frozen = False
        self.down_until = 0.0  # its mesh connection is closed until then (a blip)
        self.started = False
        self.refused = ""  # a refused welcome's reason
        self.state: str = NodeState.registering
        self.ended: tuple[str, str] | None = None
        self.round_id = self.latest_round = 0
        self.assignment: dict[str, Any] = {}
        self.running = False  # this round's workers are up
        self.spawned_at = 0.0
        self.rounds: deque[dict[str, Any]] = deque()  # assignments not yet applied (node.py's round lock)
        self.busy = False  # applying an assignment: stopping old workers or waiting for `go`
        self.waiting_go: int | None = None
        self.go_seen: set[int] = set()
        self.inbox: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()  # held while frozen
        self.last_register = self.last_beat = 0.0
        self.beats = BeatDiff()  # heartbeats carry changes only, as node.py's do
        self.ports = sim.ports()  # offered until a round makes one of them its master port
        self.relay_endpoint = f"tcp://{node_id}.sim:1" if sim.cfg.relay_size else ""
        if self.relay_endpoint:
            sim.relays[self.relay_endpoint] = self
        self.via = ""  # the relay endpoint this node sends through
        self.held_for_others: deque[tuple[SimNode, MeshOp, dict[str, Any]]] = deque()  # frozen relay: held
        self.handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            MeshOp.welcome: self.on_welcome, MeshOp.hb: lambda b: self.beats.ack(b.get("beat")),
            MeshOp.unknown: self.on_unknown,
            MeshOp.round: self.on_round, MeshOp.go: lambda b: self.on_go(int(b["round"])),
            MeshOp.job_end: self.on_job_end, MeshOp.probe: lambda b: self.send(MeshOp.pong, {"round": b.get("round")}),
            MeshOp.step_query: self.on_step_query, MeshOp.drain_workers: self.on_drain,
            MeshOp.resize_workers: self.on_drain,  # its ranks leave their group at the step: `node_drained`
            MeshOp.checkpoint_workers: lambda _b: None,
            MeshOp.kill_worker: lambda b: self.fail_worker(int(b["rank"])),
            MeshOp.left: self.on_left,
            MeshOp.relay: lambda b: self.route(str(b.get("via") or "")),
        }

    # ---- plumbing --------------------------------------------------------------------------------
    def send(self, op: MeshOp, body: dict[str, Any]) -> None:
        relay = self.sim.relays.get(self.via) if self.via else None
        if relay is None:
            self.sim.to_coordinator(self, op, body)
        elif relay.frozen:
            relay.held_for_others.append((self, op, body))
        elif not relay.killed:
            self.sim.to_coordinator(self, op, body)

    def route(self, via: str) -> None:
        """Send through the relay at `via` from now on ("": directly); a heartbeat on the new link at once."""
        if via != self.via:
            self.via = via
            if self.registered:
                self.send(MeshOp.hb, self.heartbeat_body())

    def later(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        """A node-side timer; like a message, it is lost on a dead node and held on a frozen one."""
        if delay <= 0:
            fn(*args)
        else:
            self.sim.sched.later(delay, self._fire, fn, args)

    def _fire(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self.killed:
            return
        if self.frozen:
            self.inbox.append((fn, args))
        else:
            fn(*args)

    def deliver(self, op: str, body: dict[str, Any]) -> None:
        if op in self.mute:
            return
        self._fire(self.receive, (op, body))

    def receive(self, op: str, body: dict[str, Any]) -> None:
        if not self.registered and op not in (MeshOp.welcome, MeshOp.job_end):
            return  # not welcomed yet: acts on nothing (member.py)
        if self.leaving and op not in LEAVING_OPS:
            return
        handler = self.handlers.get(op)
        if handler is not None:
            handler(body)

    # ---- what an operator (or chaos) does to the node ----------------------------------------------------
    def start(self) -> None:
        self.started = True
        self.register()
        self.sim.sched.later(self.sim.cfg.heartbeat_s, self._fire, self.beat, ())

    def kill(self) -> None:
        """SIGKILL: the daemon and (PDEATHSIG) its workers are gone, its connection closes; it never answers again."""
        self.killed, self.running = True, False
        self.sim.connection_closed(self)
        for node in self.sim.nodes.values():  # its relay links closed too: its group goes direct
            if self.relay_endpoint and node.via == self.relay_endpoint and not node.killed:
                node.route("")

    def blip(self, down_s: float) -> None:
        """Its link resets: the connection closes and the DEALER reconnects `down_s` later (a quiet moment:
        no message is lost). A frozen or cut-off node, by contrast, closes nothing."""
        self.down_until = self.sim.clock.now + down_s
        self.sim.connection_closed(self)

    def connected(self) -> bool:
        return not self.killed and self.sim.clock.now >= self.down_until

    def freeze(self) -> None:
        self.frozen = True

    def thaw(self) -> None:
        """SIGCONT: what arrived meanwhile runs in order, and an overdue heartbeat goes out at once."""
        self.frozen = False
        while self.held_for_others:  # what its group sent through it meanwhile goes on now
            node, op, body = self.held_for_others.popleft()
            self.sim.to_coordinator(node, op, body)
        while self.inbox and not self.frozen:
            fn, args = self.inbox.popleft()
            fn(*args)
        if self.registered and self.sim.clock.now - self.last_beat >= self.sim.cfg.heartbeat_s:
            self.send(MeshOp.hb, self.heartbeat_body())
            self.last_beat = self.sim.clock.now

    def leave(self, reason: str = "SIGTERM", graceful: bool = False) -> None:
        """SIGTERM (member.leave): with `graceful` its ranks drain first and it waits for `left`, up to the grace."""
        if self.departed:
            return
        self.leaving = True
        if graceful:
            self.send(MeshOp.leave, {"reason": reason, "graceful": True})
            self.later(self.sim.cfg.grace_s, self.leave, f"{reason}; the grace ran out")
            return
        self.departed, self.running = True, False
        self.send(MeshOp.leave, {"reason": reason})

    def fail_worker(self, rank: int | None = None, hang: bool = False, error: tuple[str, str] | None = None) -> None:
        """One local worker exited non-zero (or hung), raising `error` (type, message): the node reports it at once
        (node.report_failure)."""
        rank = self.assignment.get("ranks", [None])[0] if rank is None else rank
        raised = {"error": {"type": error[0], "message": error[1]}} if error else {}
        self.send(MeshOp.worker_failed, {"round": self.round_id, "reason": f"worker rank {rank} on node "
                                         f"{self.node_id} exited with exit code 1", "detected": self.sim.clock.now,
                                         "rank": rank, "hang": hang, **raised})

    # ---- registering and heartbeats ------------------------------------------------------------------
    def register(self) -> None:
        self.last_register = self.sim.clock.now
        self.beats.reset()
        self.via = ""  # registering is direct
        relay = {"relay": self.relay_endpoint} if self.relay_endpoint else {}
        self.send(MeshOp.register, {"node_id": self.node_id, "instance": self.instance, "host": f"{self.node_id}.sim",
                                    "nproc": self.nproc, "ports": self.ports, "control": "", "pub": "", **relay})

    def beat(self) -> None:
        if self.departed or (self.leaving and not self.registered):
            return
        self.sim.sched.later(self.sim.cfg.heartbeat_s, self._fire, self.beat, ())
        if not self.registered:
            if self.sim.clock.now - self.last_register >= 1.0 and not self.refused:
                self.register()  # the member retries every second until welcomed
            return
        self.last_beat = self.sim.clock.now
        self.send(MeshOp.hb, self.heartbeat_body())

    def heartbeat_body(self) -> dict[str, Any]:
        body = self.beats.body({"instance": self.instance, "ports": self.ports, "workers": [], "state": self.state,
                                "round": self.round_id, "assigned": self.latest_round,
                                "metrics": {str(r): m for r, m in self.rank_metrics().items()}}, self.sim.clock.now)
        return {**body, "via": self.via} if self.relay_endpoint else body

    def step(self) -> int | None:
        """The newest step this node's shim ranks reported; None without the shim or running workers."""
        if not (self.shim and self.running):
            return None
        return self.step0 + int((self.sim.clock.now - self.spawned_at) / self.step_time)

    def rank_metrics(self) -> dict[int, dict[str, Any]]:
        step = self.step()
        if step is None:
            return {}
        extra = {"extra": {STEP_WAIT_METRIC: self.wait_s}} if self.wait_s is not None else {}
        return {r: {"rank": r, "round": self.round_id, "step": step, "step_time": self.step_time, **extra}
                for r in self.assignment.get("ranks", [])}

    # ---- the coordinator's messages -------------------------------------------------------------------
    def on_welcome(self, body: dict[str, Any]) -> None:
        if body.get("ok"):
            self.registered, self.refused = True, ""
            self.state = str(body.get("role", NodeState.active))
            self.route(str(body.get("via") or ""))
            if self.checks_s is not None:  # member/health.py: its checks' verdict, once registered
                self.later(self.checks_s, self.send, MeshOp.health, {"checks": ["log_dir"], "findings": []})
        else:
            self.refused = str(body.get("reason", "registration refused"))

    def on_unknown(self, _body: dict[str, Any]) -> None:
        self.registered, self.running, self.round_id = False, False, 0
        if not self.leaving:
            self.register()

    def on_left(self, body: dict[str, Any]) -> None:
        self.departed, self.running, self.state = True, False, NodeState.ending
        self.ended = (JobState.stopped, str(body.get("reason", "")))

    def on_job_end(self, body: dict[str, Any]) -> None:
        self.state, self.running = NodeState.ending, False
        self.ended = (str(body.get("state", JobState.failed)), str(body.get("reason", "")))

    def on_step_query(self, body: dict[str, Any]) -> None:
        self.send(MeshOp.step_report, {"op_id": body.get("op_id"), **step_answer(self.rank_metrics(), self.round_id),
                                       "in_place": self.in_place})

    def on_drain(self, body: dict[str, Any]) -> None:
        """Shim ranks run on to `at_step`, save and say `drained`; plain workers get no request at all."""
        at_step, step, round_id = body.get("at_step"), self.step(), self.round_id
        if at_step is None or step is None:
            return
        self.later(max(0, at_step - step) * self.step_time + self.save_s, self._drained, round_id)

    def _drained(self, round_id: int) -> None:
        if self.round_id == round_id and self.running:
            self.running = False  # the ranks saved and exit: a graceful end, no failure
            self.send(MeshOp.node_drained, {"round": round_id})

    # ---- rounds (node.apply_round: one assignment at a time, old workers stopped first, spawn on `go`) ----
    def on_round(self, body: dict[str, Any]) -> None:
        round_id = body.get("round")
        if body.get("master_port") in self.ports:  # its store listens there now: offer others (beats.PortPool)
            self.ports = self.sim.ports()
        if round_id is not None:
            self.latest_round = max(self.latest_round, round_id)
            if self.waiting_go is not None and self.waiting_go < round_id:
                self.waiting_go, self.busy = None, False  # superseded while waiting for its `go`
        self.rounds.append(body)
        if body.get("prewarm"):  # a standby told to keep hot spares says `warm` once they are up (in_place.py)
            self.later(self.warm_s, self.send, MeshOp.warm, {})
        self.next_round()

    def next_round(self) -> None:
        while not self.busy and self.rounds:
            body = self.rounds.popleft()
            round_id = body.get("round")
            if round_id is not None and (round_id <= self.round_id or round_id < self.latest_round):
                continue  # stale, repeated, or already replaced
            self.busy = True
            if not self.running:
                self.stopped(body)
            elif self.stop_s is not None:  # None: the old workers never die (a wedged stop)
                self.later(self.stop_s, self.stopped, body)

    def stopped(self, body: dict[str, Any]) -> None:
        self.running = False
        round_id = body.get("round")
        if round_id is not None:
            self.round_id, self.assignment = round_id, body
            self.send(MeshOp.round_progress, {"round": round_id, "stopped": self.sim.clock.now})
        if round_id is None or body["state"] != NodeState.running:  # waiting, standby, cordoned: no workers
            self.state, self.busy = str(body.get("state", NodeState.waiting)), False
            self.next_round()
        elif round_id in self.go_seen:
            self.state = NodeState.running
            self.spawn(round_id)
        else:
            self.state, self.waiting_go = NodeState.running, round_id
            self.later(self.sim.cfg.grace_s + 2 * STOP_SLACK_S, self.go_timeout, round_id)

    def on_go(self, round_id: int) -> None:
        self.go_seen.add(round_id)
        if self.waiting_go == round_id:
            self.spawn(round_id)

    def go_timeout(self, round_id: int) -> None:
        if self.waiting_go == round_id and self.latest_round <= round_id:
            self.spawn(round_id)  # node.wait_for_go gives up waiting and starts anyway

    def spawn(self, round_id: int) -> None:
        self.waiting_go = None
        self.later(self.spawn_s, self.spawned, round_id)

    def spawned(self, round_id: int) -> None:
        self.busy = False
        if round_id == self.round_id and round_id == self.latest_round:
            self.running, self.spawned_at = True, self.sim.clock.now
            self.send(MeshOp.round_progress, {"round": round_id, "spawned": self.sim.clock.now})
            if self.shim:
                self.later(self.step_time, self.first_step, round_id)
        self.next_round()

    def first_step(self, round_id: int) -> None:
        if self.running and self.round_id == round_id:
            self.send(MeshOp.first_step, {"round": round_id, "at": self.sim.clock.now})


class Sim:
    """N SimNodes and one Coordinator (held by the first node) on a fake clock and an in-order, in-memory mesh.

    No threads and no sleeps: `run(seconds)` plays every message, node timer and coordinator tick due in that
    span, in time order. `sent` and `events` record what crossed the mesh and what the job logged, sharing one
    `order` counter. O(1) work per message, so thousands of nodes stay cheap. The coordinator's own node goes
    through the queue like any other (the daemon calls it directly): delivery order is the same, only not reentrant.
    """

    def __init__(self, nodes: int | Iterable[str] = 3, *, nproc: int = 2, min_nodes: int | None = None,
                 max_nodes: int | None = None, delay: float = 0.001, tick_s: float = 0.05, trace: bool = True,
                 store: MembershipStore | None = None, **cfg: Any) -> None:
        ids = [f"n{i:04d}" for i in range(nodes)] if isinstance(nodes, int) else list(nodes)
        self.cfg = JobConfig(min_nodes or len(ids), max_nodes or len(ids), nproc, "127.0.0.1", 29400, "simjob",
                             ids[0], ["train.py"], **cfg)
        self.clock = FakeClock()
        self.delay, self.tick_s, self.trace = delay, tick_s, trace
        self.sched = Scheduler(self.clock, {0.0, delay, tick_s, self.cfg.heartbeat_s})
        self.sent: list[Msg] = []
        self.events: list[dict[str, Any]] = []
        self.order = itertools.count()
        self._ports = itertools.count(20000)
        self.coordinator = Coordinator(self.cfg, store or MemoryStore(), self.to_node, EventLog(100_000), self.on_event,
                                       clock=self.clock, connected=self.connected, backlog=lambda: bool(self.held))
        self.stalled = False  # the coordinator's loop stands still: frames wait for it in `held`
        self.held: deque[tuple[SimNode, str, dict[str, Any]]] = deque()
        self.relays: dict[str, SimNode] = {}  # nodes by their relay endpoint (a job with relays)
        self.nodes = {n: SimNode(self, n, nproc) for n in ids}
        self.sched.later(tick_s, self.tick)

    # ---- the mesh ---------------------------------------------------------------------------------
    def ports(self) -> list[int]:
        """Four fresh ports a node reports free (a real node offers new ones once a round took one)."""
        return [next(self._ports) for _ in range(4)]

    def record(self, src: str, dst: str, op: str, body: dict[str, Any]) -> None:
        if self.trace:
            self.sent.append(Msg(next(self.order), self.clock.now, src, dst, op, body))

    def to_coordinator(self, node: SimNode, op: MeshOp, body: dict[str, Any]) -> None:
        self.record(node.node_id, COORD, op, body)
        self.sched.later(node.delay, self._coordinator_receives, node, op, body)

    def _coordinator_receives(self, node: SimNode, op: str, body: dict[str, Any]) -> None:
        if self.stalled:
            self.held.append((node, op, body))
            return
        env = Envelope("req", op, body, node=node.node_id)
        env.size = len(encode(env))  # as a daemon reads it off the socket (outside the coordinator's CPU meter)
        self.coordinator.receive(node.node_id, env, self.clock.now)

    def stall_coordinator(self, seconds: float, lose_waiting: bool = False) -> None:
        """Its loop stands still (GC, SIGSTOP); then a tick runs before the waiting frames, the worst order.

        `lose_waiting`: the frames sent meanwhile are gone (a full queue), so no backlog shows at that tick.
        """
        self.stalled = True
        self.run(seconds)
        self.stalled = False
        if lose_waiting:
            self.held.clear()
        self.coordinator.tick(self.clock.now)
        while self.held:
            self._coordinator_receives(*self.held.popleft())

    def to_node(self, node_id: str, op: MeshOp, body: dict[str, Any]) -> None:
        """The coordinator's `send`; a message to a node the simulation does not know is only recorded."""
        self.record(COORD, node_id, op, body)
        node = self.nodes.get(node_id)
        if node is not None:
            self.sched.later(node.delay, node.deliver, op, body)

    def connection_closed(self, node: SimNode) -> None:
        """The coordinator's socket monitor sees the close one link delay later."""
        self.sched.later(node.delay, lambda: self.coordinator.connection_lost(node.node_id, self.clock.now))

    def connected(self, node_id: str) -> bool:
        """What the mesh's ROUTER answers: a live connection to that node's daemon, or none."""
        node = self.nodes.get(node_id)
        return node is not None and node.connected()

    def on_event(self, event: dict[str, Any]) -> None:
        self.events.append({**event, "at": self.clock.now, "order": next(self.order)})

    def tick(self) -> None:
        if not self.stalled:
            self.coordinator.tick(self.clock.now)
        self.sched.later(self.tick_s, self.tick)

    # ---- driving --------------------------------------------------------------------------------
    def add(self, node_id: str, nproc: int | None = None, **knobs: Any) -> SimNode:
        """A node that is not part of the job yet (call `start`)."""
        node = self.nodes[node_id] = SimNode(self, node_id, self.cfg.nproc_per_node if nproc is None else nproc,
                                             **knobs)
        return node

    def configure(self, **knobs: Any) -> None:
        """The same knobs on every node (shim=True, stop_s=0.2, ...)."""
        for node in self.nodes.values():
            for key, value in knobs.items():
                setattr(node, key, value)
            self.sched.add_lane(node.stop_s)  # uniform node timers take an O(1) lane too

    def start(self, *ids: str, spacing: float = 0.0) -> None:
        """Start nodes (all not yet started when none are named), `spacing` seconds apart."""
        chosen = [self.nodes[n] for n in ids] if ids else [n for n in self.nodes.values() if not n.started]
        for i, node in enumerate(chosen):
            if spacing:
                self.sched.later(i * spacing, node.start)
            else:
                node.start()

    def run(self, seconds: float) -> None:
        self.sched.run_until(self.clock.now + seconds)

    def run_until(self, done: Callable[[], bool], timeout: float = 60.0) -> float:
        """Play ticks until `done()`; returns the simulated seconds it took, fails the test past `timeout`."""
        start = self.clock.now
        while not done():
            if self.clock.now - start > timeout:
                raise AssertionError(f"not reached within {timeout}s of simulated time")
            self.run(self.tick_s)
        return self.clock.now - start

    def formed(self, round_id: int = 1, timeout: float = 30.0) -> Round:
        """Run until round `round_id` is settled (every member's workers up, nothing pending)."""
        self.run_until(lambda: self.settled() and self.round.round_id == round_id, timeout)
        return self.round

    def settled(self) -> bool:
        """The current round's members all spawned, and nothing is pending or in flight."""
        rnd, c = self.coordinator.round, self.coordinator
        return (rnd is not None and "spawned" in rnd.timeline and c.pending is None and c.transition is None
                and c.probe.suspect is None)

    # ---- reading --------------------------------------------------------------------------------
    @property
    def round(self) -> Round:
        assert self.coordinator.round is not None, "no round yet"
        return self.coordinator.round

    def rounds(self) -> list[Round]:
        return self.coordinator.store.rounds()

    def rank_map(self, rnd: Round | None = None) -> list[tuple[str, list[int]]]:
        return [(e.node_id, e.ranks) for e in (rnd or self.round).members]

    def kinds(self, *only: str, since: int = -1) -> list[str]:
        """Event kinds in order (only those named, when any), after order `since`."""
        return [e["kind"] for e in self.events if e["order"] > since and (not only or e["kind"] in only)]

    def of(self, kind: str, since: int = -1) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind and e["order"] > since]

    def msgs(self, op: str, src: str | None = None, dst: str | None = None, since: int = -1) -> list[Msg]:
        return [m for m in self.sent if m.op == op and m.order > since and src in (None, m.src)
                and dst in (None, m.dst)]

    def mark(self) -> int:
        """An order number: what is recorded later has a larger one."""
        return next(self.order)
