"""One round's way from `round` to its first step: the stop barrier and `go`, the members' reports, what they missed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from elasticd.coordinator.core import CoordinatorCore
from elasticd.coordinator.membership import Round
from elasticd.coordinator.resize import Resizer
from elasticd.job.config import stop_barrier_s
from elasticd.wire.assignment import RoundAssignment
from elasticd.wire.member_state import EventReport, Heartbeat, ProgressReport
from elasticd.wire.names import EventKind, JobState, MeshOp, NodeStatus

PHASES = ("detect", "rendezvous", "stopped", "go", "spawned", "first_step")  # a round's timeline, in phase order


def timeline(rnd: Round) -> dict[str, float]:
    """Seconds from detection to each phase, in phase order."""
    start = rnd.timeline["detect"]
    return {p: round(rnd.timeline[p] - start, 3) for p in PHASES if p in rnd.timeline}


@dataclass
class RoundProgress:
    """One round's progress, member by member: a round that starts gets a new one, never a reset one."""

    # Nodes whose workers of the previous round still run: the new round's workers start when this
    # empties (every old rank gone), so no global rank is ever alive in two worlds at once.
    stop_barrier: set[str] = field(default_factory=set)
    stopped_at: dict[str, float] = field(default_factory=dict)  # this round's members: when their old workers were gone
    spawned_at: dict[str, float] = field(default_factory=dict)  # ... and when their new ones were up
    resent: dict[str, float] = field(default_factory=dict)  # ... and when one last got its `round` or `go` again
    reported: set[tuple[str, str]] = field(default_factory=set)  # (node, stopped|spawned) already heard
    done_nodes: set[str] = field(default_factory=set)  # members whose workers all finished


class TrackerCore(CoordinatorCore, Protocol):
    """What the tracker needs of the coordinator besides the core: members' events, assignments, in-place rounds."""

    resizer: Resizer

    def adopt(self, event: EventReport, node: str) -> None: ...

    def assignment(self, node_id: str) -> RoundAssignment: ...


class RoundTracker:
    """Follows the round in place: releases `go` once the previous round's workers are all gone (or the barrier
    times out), records the members' reports into the round's timeline, and resends what a heartbeat shows lost."""

    def __init__(self, core: TrackerCore) -> None:
        self.core = core
        self.progress = RoundProgress()

    def begin(self, previous: Round | None) -> None:
        """A round starts: the members of `previous` that are alive hold its workers until they report them gone."""
        nodes = self.core.nodes
        self.progress = RoundProgress({n for n in (previous.node_ids() if previous else [])
                                       if n in nodes and nodes[n].status == NodeStatus.alive})

    def stop_limit(self, rnd: Round) -> float:
        """How long the stop barrier waits: a node of an in-place round first waits for its kept workers to leave
        their group (elasticd/member/in_place.py), and no rank may be in two worlds while it does."""
        current = self.core.resizer.current
        in_place = current is not None and current.round_id == rnd.round_id
        return stop_barrier_s(self.core.cfg.grace_s, in_place)

    def force_if_overdue(self, now: float) -> None:
        rnd = self.core.round
        if self.progress.stop_barrier and rnd and now - rnd.started_at > self.stop_limit(rnd):
            self.release_barrier(None, forced=True)

    def node_gone(self, node_id: str) -> None:
        if node_id in self.progress.stop_barrier:
            self.release_barrier(node_id)  # a lost daemon's workers died with it (PDEATHSIG)

    def release_barrier(self, stopped: str | None, forced: bool = False) -> None:
        """A node's old workers are gone; once every one is, the members may start the new round's."""
        core, progress = self.core, self.progress
        rnd = core.round
        if stopped is not None:
            progress.stop_barrier.discard(stopped)
        if rnd is None or (progress.stop_barrier and not forced) or rnd.timeline.get("go"):
            return
        if forced:
            core.emit(EventKind.stop_barrier_timeout, round=rnd.round_id, nodes=sorted(progress.stop_barrier))
            progress.stop_barrier = set()
        rnd.timeline["go"] = core.clock()
        core.send_all(rnd.node_ids(), MeshOp.go, {"round": rnd.round_id})

    def round_progress(self, node_id: str, report: ProgressReport) -> None:
        core, progress = self.core, self.progress
        rnd = core.round
        current = rnd is not None and report.round == rnd.round_id
        step = (node_id, "stopped" if report.stopped is not None else "spawned")
        if not (current and step in progress.reported):  # a report sent again (we asked again) was logged once
            for event in report.events:  # the node's events that go with it: workers stopped, started
                core.adopt(event, node_id)
        if rnd is None or not current:
            return
        progress.reported.add(step)
        if report.stopped is not None:
            self.release_barrier(node_id)
        if rnd.entry(node_id) is None:
            return
        for at, seen in ((report.stopped, progress.stopped_at), (report.spawned, progress.spawned_at)):
            if at is not None:
                seen.setdefault(node_id, at)
        if len(progress.spawned_at) == len(rnd.members) and "spawned" not in rnd.timeline:
            rnd.timeline["stopped"] = max(progress.stopped_at.get(n, rnd.timeline["rendezvous"])
                                          for n in rnd.node_ids())
            rnd.timeline["spawned"] = max(progress.spawned_at.values())
            core.emit(EventKind.round_complete, round=rnd.round_id, cause=rnd.cause, timeline=timeline(rnd))
        core.resizer.progress(node_id, report, rnd)

    def first_step(self, node_id: str, round_id: int, at: float, step: int | None = None) -> bool:
        """Returns whether this is the round's first step (the first report of it; `step`: its number)."""
        rnd = self.core.round
        if not (rnd and round_id == rnd.round_id and "first_step" not in rnd.timeline):
            return False
        rnd.timeline["first_step"] = at
        self.core.emit(EventKind.first_step, node_id, round=round_id, cause=rnd.cause, timeline=timeline(rnd),
                       step=step)
        self.core.resizer.first_step(rnd, at)
        return True

    def node_done(self, node_id: str, round_id: int | None) -> bool:
        """Returns whether every member of the round has finished now."""
        rnd = self.core.round
        if rnd is None or round_id != rnd.round_id:
            return False
        self.progress.done_nodes.add(node_id)
        self.core.emit(EventKind.node_done, node_id, round=rnd.round_id)
        return set(rnd.node_ids()) <= self.progress.done_nodes

    def resend_missed(self, sender: str, beat: Heartbeat, now: float) -> None:
        """A member's heartbeat shows it lacks its `round` or `go` (or we lack its `stopped`): send it again."""
        core, progress = self.core, self.progress
        rnd = core.round
        if rnd is None or core.state != JobState.running or not rnd.has(sender):
            return
        # A heartbeat that crossed our `round` or `go` on the way, or one from a member too busy to have read
        # it yet, is no loss: resend only a heartbeat interval after the last sending, once per interval.
        if now - progress.resent.get(sender, rnd.started_at) <= core.cfg.heartbeat_s:
            return
        stop_unheard = sender in progress.stop_barrier and now - rnd.started_at > core.cfg.lost_after_s
        if (beat.assigned if beat.assigned is not None else rnd.round_id) < rnd.round_id or stop_unheard:
            progress.resent[sender] = now  # its `round` was lost on the way, or its `stopped` on the way back
            core.send(sender, MeshOp.round, core.assignment(sender).encode())
        elif rnd.timeline.get("go") and sender not in progress.spawned_at and beat.round == rnd.round_id \
                and now - rnd.timeline["go"] > core.cfg.heartbeat_s:  # ... or its `go`
            progress.resent[sender] = now
            core.send(sender, MeshOp.go, {"round": rnd.round_id})
