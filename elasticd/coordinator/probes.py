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

    def start_pending_round(self, now: float) -> None: ...


# A rank that fails because a peer vanished or stalled under its collective says so: gloo's "Connection reset by
# peer", NCCL's "remote process exited" or its watchdog's timeout, torch's DistBackendError. Such a failure is named
# a root cause only when nothing else is.
PEER_LOSS_TYPES = frozenset({"DistBackendError", "DistNetworkError"})
PEER_LOSS_MARKERS = ("connection reset by peer", "connection closed by peer", "broken pipe", "remote process exited",
                     "communicator was aborted", "check the logs of the remote worker",
                     "watchdog caught collective operation timeout")


@dataclass
class Suspect:
    """The reported failures of a round, and the members whose `pong` they still await."""

    reports: list[tuple[Failure, WorkerFailed]]
    awaiting: set[str] = field(default_factory=set)


class FailureProbe:
    """Holds at most one suspect round: probes its other members, and charges its failure (a round, or the job's
    end past --max-restarts) once all answered; a member that is lost meanwhile clears it.

    Every failure of that round reported before the answers are in is a candidate; the one that failed on its own
    (not a peer's loss under a collective), else the earliest, is the root cause. Until then none is named, so a
    rank that only felt the crash, on the coordinator's own node, never wins by arriving first."""

    def __init__(self, core: ProbeCore, lose_closed: Callable[[Iterable[str], float], None],
                 charged: Callable[[str, float], None] = lambda _node, _now: None) -> None:
        self.core = core
        self.lose_closed = lose_closed  # members whose connection closed are lost at once: they never answer
        self.charged = charged  # a failure charged to its node (health.py counts lemons)
        self.suspect: Suspect | None = None
        self.root: Failure | None = None  # the newest failed round's root cause
        self.consequences: list[Failure] = []  # the failures of that round that followed it
        self.echoes = 0  # all of them, named or not

    def worker_failed(self, node_id: str, report: WorkerFailed, now: float) -> None:
        core = self.core
        if core.state != JobState.running:
            return
        failure = report.failure(node_id)
        if self.root is not None and self.root.round == failure.round:
            self.consequence(failure)  # however late: the round it failed in may be replaced already
            return
        rnd = core.round
        if rnd is None or report.round != rnd.round_id:
            return
        if core.pending is not None:  # the round is already being replaced: a lost node, an operator's change
            self.emit(failure, consequence_of={"reason": core.pending.detail})
        elif self.suspect is not None:
            self.suspect.reports.append((failure, report))  # a candidate until every member answered
        else:
            others = {n for n in rnd.node_ids() if n not in (node_id, core.cfg.node_id)}
            self.suspect = Suspect([(failure, report)], set(others))
            core.send_all(sorted(others), MeshOp.probe, {"round": rnd.round_id})  # a copy: answers shrink the set
            self.lose_closed(others, now)
            self.confirm_failure(now)

    def round_replaced(self, detail: str) -> None:
        """A member was lost while its round's failures awaited their probe: they were that loss's consequences."""
        suspect, self.suspect = self.suspect, None
        for failure, _report in suspect.reports if suspect else []:
            self.emit(failure, consequence_of={"reason": detail})

    def consequence(self, failure: Failure) -> None:
        assert self.root is not None
        self.echoes += 1
        if len(self.consequences) < MAX_CONSEQUENCES:
            self.consequences.append(failure)
            self.emit(failure, consequence_of={"node": self.root.node, "rank": self.root.rank})

    def emit(self, failure: Failure, **why: Any) -> None:
        self.core.emit(EventKind.worker_failed, node=failure.node, **event_fields(failure), root_cause=not why, **why)

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
        """Every other member answered: the failure is the workers' own; its root cause is named and charged."""
        core, suspect = self.core, self.suspect
        if suspect is None or suspect.awaiting:
            return
        self.suspect = None
        ordered = sorted(suspect.reports, key=lambda pair: (felt_a_peer_loss(pair[0]), pair[0].at))
        root, report = ordered[0]
        self.root, self.consequences, self.echoes = root, [], 0
        self.emit(root)
        for failure, _report in ordered[1:]:
            self.consequence(failure)
        cause = Cause.hang if report.hang else Cause.failure
        detail = report.reason if report.reason is not None else f"worker failed on node {root.node}"
        if cause == Cause.failure and core.restarts[Cause.failure] >= core.cfg.max_restarts:
            core.end(JobState.failed, f"{detail}; --max-restarts {core.cfg.max_restarts} exhausted "
                     f"({core.restarts[Cause.failure]} failure restart(s) used)", now)
            return
        self.charged(root.node, now)
        detected = report.detected if report.detected is not None else now
        core.schedule(cause, detail, detected, due=now)  # a failed round is dead
        core.start_pending_round(now)  # at once, not at the next tick (up to 50 ms): the survivors wait for it


def felt_a_peer_loss(failure: Failure) -> bool:
    """Whether the rank failed because another vanished under its collective (its error says so)."""
    error = failure.error
    if error is None:
        return False
    text = f"{error.type}: {error.message}".lower()
    return error.type in PEER_LOSS_TYPES or any(marker in text for marker in PEER_LOSS_MARKERS)


def event_fields(failure: Failure) -> dict[str, Any]:
    """A failure as its event carries it: the node is the event's own."""
    return {k: v for k, v in failure.body().items() if k != "node" and v is not None and v != "" and v is not False}
