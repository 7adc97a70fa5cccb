"""The membership authority: decides every round (members, sticky ranks, master), counts restarts by cause."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from elasticd.config import STOP_SLACK_S, JobConfig
from elasticd.events import EventLog, emit_log
from elasticd.membership import CAUSES, MembershipStore, NodeRecord, Round, build_rank_map, sticky_order

Send = Callable[[str, str, dict[str, Any]], None]  # (node_id, op, body)
SETTLE_S = 0.1  # batch simultaneous joins/losses into one round; no fixed last-call wait
FIRST_ROUND_WAIT_S = 15.0  # the first round waits at most this long for nodes that announced themselves


class Coordinator:
    def __init__(self, cfg: JobConfig, store: MembershipStore, send: Send, events: EventLog,
                 on_event: Callable[[dict[str, Any]], None]) -> None:
        self.cfg = cfg
        self.store = store
        self.send = send
        self.events = events
        self.on_event = on_event
        self.state = "waiting"  # waiting | running | succeeded | failed | stopped
        self.reason = f"waiting for {cfg.min_nodes} node(s) to register"
        self.target = cfg.max_nodes
        self.restarts = dict.fromkeys(CAUSES, 0)
        self.round: Round | None = None
        self.pending: tuple[str, str, float] | None = None  # (cause, detail, detected_at)
        self.pending_due = 0.0
        self.waiting_since = time.time()
        self.done_nodes: set[str] = set()
        # A reported worker failure waits here until every other member answers a probe: when a node
        # died, its peers' workers fail too, and that is a membership change, not a charged failure.
        self.suspect: dict[str, Any] | None = None
        self.transition: Any = None  # an elasticd.steer.Transition in flight (drain, scale down, stop)
        self.queries: dict[str, Any] = {}  # elasticd.step_agreement.StepQuery by op id
        # Set by elasticd.steer: before a round that restarts healthy shim workers, stop them at one step.
        self.reform_first: Callable[[Coordinator, str, str, float], bool] = lambda *_: False
        self.reformed = False  # the workers already stopped gracefully for the pending round
        self.announced: dict[str, float] = {}  # node id -> when it said it is warming up to join
        # Nodes whose workers of the previous round still run: the new round's workers start when this
        # empties (every old rank gone), so no global rank is ever alive in two worlds at once.
        self.stop_barrier: set[str] = set()
        self.used_ports: set[int] = set()
        self._join_seq = 0
        self.ended_at = 0.0

    # ---- events -------------------------------------------------------------------------------
    def emit(self, kind: str, node: str = "", ts: float = 0.0, **fields: Any) -> dict[str, Any]:
        event = self.events.append(kind, node or self.cfg.node_id, ts, **fields)
        emit_log(event)
        self.on_event(event)
        return event

    def adopt(self, event: dict[str, Any]) -> None:
        """A member's event enters the job log with the job's sequence number."""
        fields = {k: v for k, v in event.items() if k not in ("seq", "ts", "kind", "node")}
        ts = event.get("ts")
        self.emit(str(event.get("kind", "unknown")), str(event.get("node", "?")),
                  float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else 0.0, **fields)

    # ---- membership ----------------------------------------------------------------------------
    @property
    def nodes(self) -> dict[str, NodeRecord]:
        return self.store.nodes()

    def alive(self) -> list[NodeRecord]:
        return [n for n in self.nodes.values() if n.status == "alive"]

    def register(self, body: dict[str, Any], now: float) -> dict[str, Any]:
        node_id, instance = body["node_id"], body["instance"]
        old = self.nodes.get(node_id)
        if old and old.status == "alive" and old.instance != instance:
            return {"ok": False, "reason": f"node id '{node_id}' is already in job '{self.cfg.job_id}' "
                    f"(host {old.host}); give each node a unique --node-id"}
        if self.state in ("succeeded", "failed", "stopped"):
            return {"ok": False, "reason": f"job '{self.cfg.job_id}' has ended ({self.state})"}
        self._join_seq += 1
        self.announced.pop(node_id, None)
        active = sum(1 for n in self.alive() if n.role == "active" and n.node_id != node_id)
        role = old.role if old and old.role == "cordoned" else ("active" if active < self.target else "standby")
        node = NodeRecord(node_id, body["host"], int(body["nproc"]), instance, self._join_seq, role=role,
                          last_seen=now, ports=list(body.get("ports", [])), control=body.get("control", ""),
                          pub=body.get("pub", ""))
        self.store.put_node(node)
        self.emit("node_joined", node_id, host=node.host, nproc=node.nproc, role=role)
        if role == "active":
            self.schedule("membership", f"node {node_id} joined", now)
        return {"ok": True, "role": role, "job": self.status(now)}

    def announce(self, node_id: str, now: float) -> None:
        """A daemon started and is warming up (its zygote imports torch); it registers when ready."""
        if node_id not in self.nodes or self.nodes[node_id].status != "alive":
            self.announced[node_id] = now

    def awaiting_announced(self, members: int, now: float) -> bool:
        """Hold the first round for nodes that announced themselves: they are warming up, not absent."""
        coming = [n for n, at in self.announced.items() if now - at < FIRST_ROUND_WAIT_S and n not in self.nodes]
        return self.round is None and bool(coming) and members + len(coming) <= self.cfg.max_nodes

    def heartbeat(self, node_id: str, body: dict[str, Any], now: float) -> bool:
        node = self.nodes.get(node_id)
        if node is None or node.status != "alive" or node.instance != body.get("instance"):
            return False  # unknown to us (lost, or a coordinator restart): the node must register again
        node.last_seen = now
        node.ports = list(body.get("ports", node.ports))
        node.workers = body.get("workers", node.workers)
        node.metrics = body.get("metrics", node.metrics)
        return True

    def remove(self, node_id: str, status: str, detail: str, now: float) -> None:
        node = self.nodes.get(node_id)
        if node is None or node.status != "alive":
            return
        node.status = status
        self.emit("node_lost" if status == "lost" else "node_left", node_id, reason=detail)
        if self.round and node_id in self.round.node_ids():
            self.suspect = None
            self.schedule("membership", detail, now)
        if node_id in self.stop_barrier:
            self.release_barrier(node_id)  # a lost daemon's workers died with it (PDEATHSIG)

    def check_liveness(self, now: float) -> None:
        for node in self.alive():
            if node.node_id != self.cfg.node_id and now - node.last_seen > self.cfg.lost_after_s:
                self.remove(node.node_id, "lost", f"node {node.node_id} missed "
                            f"{self.cfg.heartbeat_misses} heartbeats", now)

    # ---- rounds -------------------------------------------------------------------------------
    def schedule(self, cause: str, detail: str, detected_at: float) -> None:
        """Queue a new round; the first cause queued is the root cause and keeps its detection time."""
        if self.state in ("succeeded", "failed", "stopped"):
            return
        if self.pending is None:
            self.pending = (cause, detail, detected_at)
        self.pending_due = time.time() + SETTLE_S

    def tick(self, now: float) -> None:
        if self.state in ("succeeded", "failed", "stopped"):
            return
        self.check_liveness(now)
        if self.pending and now >= self.pending_due:
            cause, detail, detected = self.pending
            if self.transition is not None and cause in ("membership", "operator"):
                return  # a graceful stop is in flight; its end starts the round
            if self.awaiting_announced(sum(1 for n in self.alive() if n.role == "active"), now):
                return
            self.pending = None
            if not self.reform_first(self, cause, detail, detected):
                self.start_round(cause, detail, detected, now)
        if self.stop_barrier and self.round and now - self.round.started_at > self.cfg.grace_s + STOP_SLACK_S:
            self.release_barrier(None, forced=True)
        if self.state == "waiting" and now - self.waiting_since > self.cfg.join_timeout_s:
            self.end("failed", f"join timeout: {self.reason} for {self.cfg.join_timeout_s:.0f}s", now)

    def candidates(self) -> list[NodeRecord]:
        """Active nodes up to the target, promoting standbys when the job is below it."""
        alive = sorted(self.alive(), key=lambda n: n.joined_seq)
        order = sticky_order(self.round.node_ids() if self.round else [], [n for n in alive if n.role == "active"])
        cap = min(self.target, self.cfg.max_nodes)
        for node in alive:
            if len(order) >= cap:
                break
            if node.role == "standby":
                node.role = "active"
                order.append(node.node_id)
                self.emit("node_role", node.node_id, role="active")
        for node_id in order[cap:]:
            self.nodes[node_id].role = "standby"
            self.emit("node_role", node_id, role="standby")
        return [self.nodes[n] for n in order[:cap]]

    def start_round(self, cause: str, detail: str, detected: float, now: float) -> None:
        self.abandon_transition()
        self.reformed = False
        members = self.candidates()
        previous = self.round
        if len(members) < self.cfg.min_nodes:
            if self.state != "waiting":
                self.waiting_since = now
            self.state = "waiting"
            self.reason = (f"waiting for {self.cfg.min_nodes - len(members)} more node(s): "
                           f"{len(members)} active, --nnodes min is {self.cfg.min_nodes}")
            self.emit("waiting", reason=self.reason, join_timeout_s=self.cfg.join_timeout_s)
            for node in self.alive():
                self.send(node.node_id, "round", {"round": None, "state": "waiting", "reason": self.reason})
            return
        if previous is not None and self.state == "running":
            self.restarts[cause] += 1
            for node_id in previous.node_ids():  # these nodes' workers are restarted by this round
                if node_id in self.nodes and self.nodes[node_id].status == "alive":
                    self.nodes[node_id].restarts[cause] += 1
        first = sorted(members, key=lambda n: (n.node_id != self.cfg.node_id, n.joined_seq))  # ours is rank 0
        entries, world = build_rank_map([m.node_id for m in (first if previous is None else members)], self.nodes)
        master = self.nodes[entries[0].node_id]
        port = next((p for p in master.ports if p not in self.used_ports), 0)
        self.used_ports.add(port)
        round_id = (previous.round_id + 1) if previous else 1
        rnd = Round(round_id, entries, world, master.host, port, cause if previous else "start", detail, now,
                    timeline={"detect": detected, "rendezvous": now})
        self.round, self.state, self.reason = rnd, "running", ""
        self.done_nodes = set()
        self.stop_barrier = {n for n in (previous.node_ids() if previous else [])
                             if n in self.nodes and self.nodes[n].status == "alive"}
        self.store.put_round(rnd)
        self.emit("round_started", round=round_id, world_size=world, cause=rnd.cause, detail=detail,
                  rank_map={e.node_id: e.ranks for e in entries})
        for node in self.alive():
            self.send(node.node_id, "round", self.assignment(node.node_id))
        self.release_barrier(None)

    def release_barrier(self, stopped: str | None, forced: bool = False) -> None:
        """A node's old workers are gone; once every one is, the members may start the new round's."""
        rnd = self.round
        if stopped is not None:
            self.stop_barrier.discard(stopped)
        if rnd is None or (self.stop_barrier and not forced) or rnd.timeline.get("go"):
            return
        if forced:
            self.emit("stop_barrier_timeout", round=rnd.round_id, nodes=sorted(self.stop_barrier))
            self.stop_barrier = set()
        rnd.timeline["go"] = time.time()
        for node_id in rnd.node_ids():
            self.send(node_id, "go", {"round": rnd.round_id})

    def abandon_transition(self) -> None:
        """A round that starts anyway (a failure, a lost node) ends a graceful stop where it stands."""
        trans, self.transition = self.transition, None
        if trans is not None:
            for node_id in trans.leaving:
                self.nodes[node_id].role = trans.final_role
            self.emit(f"{trans.kind}_abandoned", op_id=trans.op_id, reason="a new round started first")

    def assignment(self, node_id: str) -> dict[str, Any]:
        rnd = self.round
        assert rnd is not None
        entry = rnd.entry(node_id)
        node = self.nodes[node_id]
        return {
            "round": rnd.round_id, "state": "running" if entry else node.role,
            "group_rank": entry.group_rank if entry else None,
            "group_world_size": len(rnd.members), "ranks": entry.ranks if entry else [],
            "world_size": rnd.world_size, "master_addr": rnd.master_addr, "master_port": rnd.master_port,
            "restart_count": self.restarts["failure"], "max_restarts": self.cfg.max_restarts,
        }

    def round_progress(self, node_id: str, body: dict[str, Any]) -> None:
        rnd = self.round
        if rnd is None or body.get("round") != rnd.round_id:
            return
        if "stopped" in body:
            self.release_barrier(node_id)
        if rnd.entry(node_id) is None:
            return
        for phase in ("stopped", "spawned"):
            if phase in body:
                rnd.timeline.setdefault(f"{phase}:{node_id}", float(body[phase]))
        spawned = [rnd.timeline.get(f"spawned:{n}") for n in rnd.node_ids()]
        if all(spawned) and "spawned" not in rnd.timeline:
            stopped = [rnd.timeline.get(f"stopped:{n}", rnd.timeline["rendezvous"]) for n in rnd.node_ids()]
            rnd.timeline["stopped"] = max(stopped)
            rnd.timeline["spawned"] = max(s for s in spawned if s)
            self.emit("round_complete", round=rnd.round_id, cause=rnd.cause, timeline=self.timeline(rnd))

    def first_step(self, node_id: str, round_id: int, at: float) -> None:
        rnd = self.round
        if rnd and round_id == rnd.round_id and "first_step" not in rnd.timeline:
            rnd.timeline["first_step"] = at
            self.emit("first_step", node_id, round=round_id, cause=rnd.cause, timeline=self.timeline(rnd))

    @staticmethod
    def timeline(rnd: Round) -> dict[str, float]:
        """Seconds from detection to each phase, in phase order."""
        start = rnd.timeline["detect"]
        phases = ("detect", "rendezvous", "stopped", "go", "spawned", "first_step")
        return {p: round(rnd.timeline[p] - start, 3) for p in phases if p in rnd.timeline}

    def worker_failed(self, node_id: str, body: dict[str, Any], now: float) -> None:
        rnd = self.round
        stale = rnd is None or body.get("round") != rnd.round_id or self.state != "running"
        if stale or self.pending is not None or self.suspect is not None:
            return  # this round is already being replaced; its later failures are echoes
        others = {n for n in rnd.node_ids() if n not in (node_id, self.cfg.node_id)}
        self.suspect = {"node": node_id, "body": body, "awaiting": others}
        for other in sorted(others):  # a copy: answers may shrink the awaited set
            self.send(other, "probe", {"round": rnd.round_id})
        self.confirm_failure(now)

    def pong(self, node_id: str, now: float) -> None:
        if self.suspect is not None:
            self.suspect["awaiting"].discard(node_id)
            self.confirm_failure(now)

    def confirm_failure(self, now: float) -> None:
        """Every other member answered: the failure is the worker's own, and it is charged."""
        if self.suspect is None or self.suspect["awaiting"]:
            return
        node_id, body = self.suspect["node"], self.suspect["body"]
        self.suspect = None
        cause = "hang" if body.get("hang") else "failure"
        detail = str(body.get("reason", f"worker failed on node {node_id}"))
        if cause == "failure" and self.restarts["failure"] >= self.cfg.max_restarts:
            self.end("failed", f"{detail}; --max-restarts {self.cfg.max_restarts} exhausted "
                     f"({self.restarts['failure']} failure restart(s) used)", now)
            return
        self.schedule(cause, detail, float(body.get("detected", now)))
        self.pending_due = now  # a failed round is dead: no reason to wait for company

    def node_done(self, node_id: str, body: dict[str, Any], now: float) -> None:
        rnd = self.round
        if rnd is None or body.get("round") != rnd.round_id:
            return
        self.done_nodes.add(node_id)
        self.emit("node_done", node_id, round=rnd.round_id)
        if set(rnd.node_ids()) <= self.done_nodes and self.pending is None and self.transition is None:
            self.end("succeeded", f"every worker of the final round finished (world {rnd.world_size})", now)

    def end(self, state: str, reason: str, now: float) -> None:
        if self.state in ("succeeded", "failed", "stopped"):
            return
        self.state, self.reason, self.ended_at = state, reason, now
        self.pending = self.transition = None
        self.emit("job_end", state=state, reason=reason)
        for node in self.alive():
            self.send(node.node_id, "job_end", {"state": state, "reason": reason})

    def status(self, now: float) -> dict[str, Any]:
        rnd = self.round
        return {
            "job_id": self.cfg.job_id, "state": self.state, "reason": self.reason,
            "round": rnd.round_id if rnd else 0, "world_size": rnd.world_size if rnd else 0,
            "min_nodes": self.cfg.min_nodes, "max_nodes": self.cfg.max_nodes, "target": self.target,
            "coordinator": self.cfg.node_id, "restarts": dict(self.restarts),
            "max_restarts": self.cfg.max_restarts,
            "last_recovery": self.timeline(rnd) if rnd else {},
            "rank_map": rnd.public()["members"] if rnd else [],
            "nodes": [n.public(now) for n in sorted(self.nodes.values(), key=lambda n: n.joined_seq)],
            "seq": self.events.seq,
        }
