"""The coordinator's side of in-place resizes: which rounds keep their workers, and each one's timeline.

docs/architecture.md, "Generations". A round is in place when the job has a long-lived store and every surviving
member's workers said they resize in place (trainer_shim.Elastic); then members keep those processes and only the
missing ranks are forked. Anything that goes wrong falls back to a restart round, the reason in the event log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elasticd.coordinator.membership import NodeRecord, Round
from elasticd.coordinator.step_agreement import StepQuery
from elasticd.wire.heal_report import Heal
from elasticd.wire.member_state import ProgressReport
from elasticd.wire.names import EventKind, generation_prefix

RESIZE_TIMEOUT_S = 30.0  # an in-place round whose ranks have not all synced by then falls back to a restart
WARM_TIMEOUT_S = 30.0  # how long a join's round waits for the joiner's pre-started workers
Emit = Callable[..., dict[str, Any]]  # Coordinator.emit


@dataclass
class InPlaceRound:
    """One generation formed in place, until its `resize` event (or its fallback)."""

    round_id: int
    members: set[str]
    started: float
    timeline: dict[str, float]
    synced: dict[str, ProgressReport] = field(default_factory=dict)  # node -> its report, its last rank to join's
    heals: dict[str, Heal] = field(default_factory=dict)  # node -> what its ranks' heal moved


class Resizer:
    """The coordinator's in-place rounds: whether a round keeps its workers, the one in flight until its `resize`
    event, and why the next round falls back to a restart when one fails."""

    def __init__(self, job_id: str, emit: Emit) -> None:
        self.job_id = job_id
        self.emit = emit
        self.store = ""  # host:port of the job's store (member/store/job_store.py); "" means no in-place resizes
        self.store_pending = False  # the store is starting: the first round waits for it
        self.tunnel = ""  # with --keys: the coordinator's store tunnel, through which every node reaches the store
        self.agreed_at = 0.0  # a graceful change's ranks left their group at an agreed step: its round is in place
        self.fall_back = ""  # why the next round restarts its workers (the last in-place resize failed)
        self.current: InPlaceRound | None = None
        self.in_place_nodes: dict[str, int] = {}  # node -> the round in which all its ranks joined as in-place workers
        self.warming: dict[str, float] = {}  # joiner -> since when its pre-started workers are starting
        self.spares_told: set[str] = set()  # standbys told to keep hot spares, since they last were not

    def agree(self, query: StepQuery, now: float) -> bool:
        """A graceful change: resize in place when every member answered, each with only in-place workers."""
        if not self.store or self.fall_back or query.awaiting or not query.in_place:
            return False
        self.agreed_at = now
        return True

    def begin(self, previous: Round | None, members: list[NodeRecord], round_id: int, detected: float,
              now: float) -> bool:
        """Whether round `round_id` keeps its survivors' workers; it is tracked until its `resize` event."""
        agreed, self.agreed_at = self.agreed_at, 0.0
        if self.current is not None and previous is not None and self.current.round_id == previous.round_id:
            self.abandon(f"round {round_id} started before generation {previous.round_id} had synced")
        fall_back, self.fall_back = self.fall_back, ""
        self.current = None
        if not self.store or previous is None or fall_back:
            return False
        survivors = [m for m in members if previous.has(m.node_id)]
        capable = all(self.in_place_nodes.get(m.node_id) == previous.round_id or self.capable(m, previous)
                      for m in survivors)
        if not survivors or not (agreed or capable):
            return False
        self.current = InPlaceRound(round_id, {m.node_id for m in members}, now,
                                    {"detect": detected, "agreed": agreed or detected})
        return True

    @staticmethod
    def capable(node: NodeRecord, previous: Round) -> bool:
        """Every rank this node ran in the previous round said hello as an in-place worker (its heartbeat)."""
        entry = previous.entry(node.node_id)
        ranks = {str(r): node.metrics.get(str(r)) for r in (entry.ranks if entry else [])}
        return bool(ranks) and all(isinstance(m, dict) and m.get("in_place") is True
                                   and m.get("round") == previous.round_id for m in ranks.values())

    def force_restart(self, reason: str) -> None:
        """The next round restarts every worker whatever they support (`elasticd restart` means it)."""
        self.fall_back = reason

    def prewarm(self, node: NodeRecord, rnd: Round | None, now: float) -> bool:
        """A node joining a running job of in-place workers starts its own before the change: it is told so in
        its welcome, and the change waits (at most WARM_TIMEOUT_S) until they are up."""
        if not self.store or self.fall_back or rnd is None or rnd.has(node.node_id) \
                or not all(self.in_place_nodes.get(n) == rnd.round_id for n in rnd.node_ids()):
            return False
        self.warming.setdefault(node.node_id, now)
        return True

    def hot_spares(self, node_id: str, prewarm: bool, now: float) -> None:
        """A round told this node whether to keep hot spares. Told first (a drained node stays a standby), it
        starts them now: a change that adds it waits (at most WARM_TIMEOUT_S) until they are up, as a joiner's
        does; a scale right after a drain otherwise found them still loading and forked cold ones."""
        if not prewarm:
            self.spares_told.discard(node_id)
        elif node_id not in self.spares_told:
            self.spares_told.add(node_id)
            self.warming.setdefault(node_id, now)

    def warm(self, node_id: str) -> None:
        self.warming.pop(node_id, None)

    def warming_up(self, alive: set[str], now: float) -> bool:
        """A joiner's workers are still starting: the round that adds it waits for them."""
        for node_id, since in list(self.warming.items()):
            if node_id not in alive or now - since > WARM_TIMEOUT_S:
                del self.warming[node_id]
        return bool(self.warming)

    def job_store_starting(self) -> None:
        """The job's store is starting on this node: the first round waits for it (its workers use it)."""
        self.store_pending = True

    def job_store_started(self, addr: str, tunnel: str) -> None:
        """The job's store is up at `addr` ("": it did not start, so no in-place resizes), reached through `tunnel`
        with --keys; rounds wait for it no longer."""
        self.store, self.tunnel, self.store_pending = addr, tunnel, False

    @property
    def job_prefix(self) -> str:
        """The job's keys in its store; each generation's are under `JOB/gROUND`."""
        return f"elastic/{self.job_id}"

    def fields(self, rnd: Round) -> dict[str, Any]:
        """What a round's assignment adds for every node: the store and prefix, whether this round is in place."""
        if not self.store:
            return {"in_place": False}
        return {"in_place": self.in_place(rnd), "store": self.store,
                "prefix": generation_prefix(self.job_prefix, rnd.round_id),
                **({"job_store_tunnel": self.tunnel} if self.tunnel else {})}

    def hot_spare(self, rnd: Round, standby: bool) -> bool:
        """Whether a standby node of an in-place job keeps workers started, waiting (hot spares)."""
        return bool(self.store) and standby and not self.fall_back and self.in_place(rnd)

    def in_place(self, rnd: Round) -> bool:
        cur = self.current
        return cur is not None and cur.round_id == rnd.round_id

    def progress(self, node_id: str, report: ProgressReport, rnd: Round) -> None:
        if report.in_place:
            self.in_place_nodes[node_id] = rnd.round_id
        cur = self.current
        if cur is None or cur.round_id != rnd.round_id:
            return
        if report.synced is not None and node_id in cur.members:
            cur.synced[node_id] = report
            if report.heal is not None:
                cur.heals[node_id] = report.heal
        self.finish_if_done(rnd)

    def first_step(self, rnd: Round, at: float) -> None:
        cur = self.current
        if cur is not None and cur.round_id == rnd.round_id:
            cur.timeline.setdefault("first_step", at)
            self.finish_if_done(rnd)

    def finish_if_done(self, rnd: Round) -> None:
        """Every member synced and a first step seen: the `resize` event, with its timeline from detection."""
        cur = self.current
        if cur is None or "first_step" not in cur.timeline or cur.synced.keys() < cur.members:
            return
        self.current = None
        marks = dict(cur.timeline)
        marks.setdefault("left", rnd.timeline.get("go", marks["agreed"]))  # every old rank was out by `go`
        last_node = max(cur.synced, key=lambda n: cur.synced[n].synced or 0.0)  # the stall ended with its last rank
        last = cur.synced[last_node]
        marks["synced"] = last.synced or 0.0
        marks["group_ready"] = last.group_ready or marks["left"]
        start = marks["detect"]
        order = ("detect", "agreed", "left", "group_ready", "synced", "first_step")
        heal = Heal.merged(list(cur.heals.values()), cur.heals.get(last_node)) if cur.heals else None
        last_steps = [r.last_step_at for r in cur.synced.values() if r.last_step_at is not None]
        marks["stalled"] = min(last_steps, default=marks["agreed"])  # training stopped (a crash: before detection)
        self.emit(EventKind.resize, generation=rnd.round_id, round=rnd.round_id, world_size=rnd.world_size,
                  cause=rnd.cause, detail=rnd.detail,
                  timeline={p: round(marks[p] - start, 3) for p in order if p in marks},
                  stall_s=round(marks["first_step"] - marks["stalled"], 3),
                  parts=stall_parts(marks, last, heal),
                  **({"heal": heal.encode()} if heal else {}))

    def failed(self, round_id: int, reason: str) -> bool:
        """A member says its part of this in-place round failed: True when the coordinator must restart."""
        cur = self.current
        if cur is None or cur.round_id != round_id:
            return False
        return self.abandon(reason)

    def settling(self, now: float) -> bool:
        """A generation formed in place has not had its `resize` yet: a member's join or leave waits for it (at
        most RESIZE_TIMEOUT_S), since a round begun now would abandon it and restart every worker from the last
        checkpoint, losing the steps since (two nodes started a moment apart)."""
        cur = self.current
        return cur is not None and now - cur.started < RESIZE_TIMEOUT_S

    def expired(self, now: float) -> bool:
        cur = self.current
        if cur is None or now - cur.started < RESIZE_TIMEOUT_S or cur.synced.keys() >= cur.members:
            return False
        return self.abandon(f"not every rank of generation {cur.round_id} synced within {RESIZE_TIMEOUT_S:.0f}s")

    def abandon(self, reason: str) -> bool:
        cur, self.current = self.current, None
        assert cur is not None
        self.fall_back = reason
        self.emit(EventKind.resize_failed, generation=cur.round_id, round=cur.round_id, reason=reason)
        return True


def stall_parts(marks: dict[str, float], last: ProgressReport, heal: Heal | None) -> dict[str, float]:
    """Where a resize's stall went, in seconds that add up to it (the end of the first rank's last step in the old
    world, or the agreement when no rank was in one, to the first step), along the rank it ended with (the last to
    hold the freshest state): the boundary's agreement and every old rank out with the round started (`leave`),
    forming its new group, its script's rebuild, reading the state it heals, its wait for the slowest rank's
    rebuild, the collection that freed its old world, its heal's plan and transfer, its `load_state_dict`, the
    first step, and `other` for what no part timed."""
    parts = {"leave": marks["left"] - marks["stalled"], "group": marks["group_ready"] - marks["left"],
             "rebuild": last.rebuild_s or 0.0, "state": last.state_s or 0.0, "wait": last.wait_s or 0.0,
             "collect": last.collect_s or 0.0, "plan": heal.plan_s if heal else 0.0,
             "transfer": heal.transfer_s if heal else 0.0, "restore": last.restore_s or 0.0,
             "first_step": marks["first_step"] - marks["synced"]}
    parts["other"] = marks["first_step"] - marks["stalled"] - sum(parts.values())
    return {name: round(seconds, 3) for name, seconds in parts.items()}
