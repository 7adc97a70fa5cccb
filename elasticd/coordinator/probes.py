"""Failure probes: a worker's failure is charged only once every other member of its round answers a probe.

When a node dies, its peers' workers fail too; that is a membership change, not a charged failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from elasticd.coordinator.core import CoordinatorCore, PendingRound
from elasticd.wire.diagnosis import Failure
from elasticd.wire.member_state import WorkerFailed
from elasticd.wire.names import Cause, EventKind, JobState, MeshOp

MAX_CONSEQUENCES = 16  # echoes of one failure named in events and the job's end; the rest are counted


class ProbeCore(CoordinatorCore, Protocol):
    """What a failure probe needs of the coordinator besides the core: the restart budget, and a round or an end."""

    pending: PendingRound | None
    restarts: dict[Cause, int]

    def end(self, state: JobState, reason: str, now: float) -> None: ...

    def schedule(self, cause: Cause, detail: str, detected_at: float, due: float | None = None) -> None: ...


@dataclass
class Suspect:
    """A reported worker failure, and the members whose `pong` it still awaits."""

    node_id: str
    report: WorkerFailed
    awaiting: set[str] = field(default_factory=set)


class FailureProbe:
    """Holds at most one suspect failure: probes the round's other members, and charges the failure (a round, or
    the job's end past --max-restarts) once all answered; a member that is lost meanwhile clears it."""

    def __init__(self, core: ProbeCore, lose_closed: Callable[[Iterable[str], float], None],
                 charged: Callable[[str, float], None] = lambda _node, _now: None) -> None:
        self.core = core
        self.lose_closed = lose_closed  # members whose connection closed are lost at once: they never answer
        self.charged = charged  # a failure charged to its node (health.py counts lemons)
        self.suspect: Suspect | None = None
        self.root: Failure | None = None  # the first failure of the newest round that failed: its root cause
        self.consequences: list[Failure] = []  # the failures of that round that followed it
        self.echoes = 0  # all of them, named or not

    def worker_failed(self, node_id: str, report: WorkerFailed, now: float) -> None:
        core = self.core
        rnd = core.round
        if rnd is None or report.round != rnd.round_id or core.state != JobState.running:
            return
        self.name_cause(report.failure(node_id))
        if core.pending is not None or self.suspect is not None:
            return  # this round is already being replaced; its later failures are echoes
        others = {n for n in rnd.node_ids() if n not in (node_id, core.cfg.node_id)}
        self.suspect = Suspect(node_id, report, set(others))
        core.send_all(sorted(others), MeshOp.probe, {"round": rnd.round_id})  # a copy: answers shrink the set
        self.lose_closed(others, now)
        self.confirm_failure(now)

    def name_cause(self, failure: Failure) -> None:
        """The first failure of a round is its root cause; the ranks that fail after it (in a collective with it, or
        after a lost node) are its consequences, named in their events but never as a cause."""
        core = self.core
        if self.root is not None and self.root.round == failure.round:
            self.echoes += 1
            if len(self.consequences) < MAX_CONSEQUENCES:
                self.consequences.append(failure)
                core.emit(EventKind.worker_failed, node=failure.node, **event_fields(failure), root_cause=False,
                          consequence_of={"node": self.root.node, "rank": self.root.rank})
            return
        if core.pending is not None:  # the round is already being replaced: a lost node, an operator's change
            core.emit(EventKind.worker_failed, node=failure.node, **event_fields(failure), root_cause=False,
                      consequence_of={"reason": core.pending.detail})
            return
        self.root, self.consequences, self.echoes = failure, [], 0
        core.emit(EventKind.worker_failed, node=failure.node, **event_fields(failure), root_cause=True)

    def root_cause(self) -> dict[str, Any] | None:
        """The newest failed round's root cause, as `status` and the job's end carry it."""
        if self.root is None:
            return None
        return {**self.root.body(), "consequences": self.echoes}

    def pong(self, node_id: str, now: float) -> None:
        if self.suspect is not None:
            self.suspect.awaiting.discard(node_id)
            self.confirm_failure(now)

    def awaits(self, node_id: str) -> bool:
        """Whether a suspect failure waits for this member's `pong`."""
        return self.suspect is not None and node_id in self.suspect.awaiting

    def confirm_failure(self, now: float) -> None:
        """Every other member answered: the failure is the worker's own, and it is charged."""
        core, suspect = self.core, self.suspect
        if suspect is None or suspect.awaiting:
            return
        self.suspect = None
        report = suspect.report
        cause = Cause.hang if report.hang else Cause.failure
        detail = report.reason if report.reason is not None else f"worker failed on node {suspect.node_id}"
        if cause == Cause.failure and core.restarts[Cause.failure] >= core.cfg.max_restarts:
            core.end(JobState.failed, f"{detail}; --max-restarts {core.cfg.max_restarts} exhausted "
                     f"({core.restarts[Cause.failure]} failure restart(s) used)", now)
            return
        self.charged(suspect.node_id, now)
        detected = report.detected if report.detected is not None else now
        core.schedule(cause, detail, detected, due=now)  # a failed round is dead


def event_fields(failure: Failure) -> dict[str, Any]:
    """A failure as its event carries it: the node is the event's own."""
    return {k: v for k, v in failure.body().items() if k != "node" and v is not None and v != "" and v is not False}
