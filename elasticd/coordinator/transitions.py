"""Graceful membership changes in flight: what a transition is, and the events that mark its life."""

from __future__ import annotations

from dataclasses import dataclass, field

from elasticd.wire.names import After, Cause, EventKind, Role, TransitionKind

DRAIN_TIMEOUT_S = 30.0  # past this, a transition completes without the ranks that never said `drained`
# A scheduler signals every node of a job at once (SLURM's time limit or --signal, a Kubernetes job deleted): a
# transition begun by a signal waits this long before it asks for the step, so that the other nodes' signals fold
# into it and the whole job stops at one agreed step with a checkpoint (docs/architecture.md, "Job-wide signals").
SIGNAL_WINDOW_S = 0.2


@dataclass(frozen=True)
class TransitionEvents:
    started: EventKind
    progress: EventKind
    complete: EventKind
    abandoned: EventKind


EVENTS: dict[TransitionKind, TransitionEvents] = {
    TransitionKind.drain: TransitionEvents(EventKind.drain_started, EventKind.drain_progress,
                                           EventKind.drain_complete, EventKind.drain_abandoned),
    TransitionKind.scale: TransitionEvents(EventKind.scale_started, EventKind.scale_progress,
                                           EventKind.scale_complete, EventKind.scale_abandoned),
    TransitionKind.cordon: TransitionEvents(EventKind.cordon_started, EventKind.cordon_progress,
                                            EventKind.cordon_complete, EventKind.cordon_abandoned),
    TransitionKind.stop: TransitionEvents(EventKind.stop_started, EventKind.stop_progress,
                                          EventKind.stop_complete, EventKind.stop_abandoned),
    TransitionKind.reform: TransitionEvents(EventKind.reform_started, EventKind.reform_progress,
                                            EventKind.reform_complete, EventKind.reform_abandoned),
}


@dataclass
class Transition:
    """Shim workers stop at one agreed step; then the job re-forms without `leaving`, or ends."""

    op_id: str
    kind: TransitionKind
    leaving: list[str]
    final_role: Role  # the leaving nodes' role once it completes
    then: After
    awaiting: set[str]  # members whose ranks have not yet said `drained`
    deadline: float
    started: float  # when the change was asked for (or, for a reform, detected): its recovery timeline starts here
    cause: Cause = Cause.membership  # the cause of the round that follows
    detail: str = ""
    departing: dict[str, str] = field(default_factory=dict)  # node -> reason: leaves the job once this ends
    ask_at: float = 0.0  # when to ask for the step: its start, or a signal's window later
    asked: bool = False
    in_place: bool = False  # its step was agreed as a resize: the ranks keep their state, and save no checkpoint

    @property
    def events(self) -> TransitionEvents:
        return EVENTS[self.kind]

    def depart(self, node_id: str, reason: str) -> bool:
        """Fold one more leaving node into this transition: its ranks stop at the same agreed step.

        Returns whether it is new to the transition (its role then changes to draining)."""
        self.departing[node_id] = reason
        if node_id in self.leaving:
            return False
        self.leaving.append(node_id)
        return True

    def stays(self, members: list[str]) -> list[str]:
        """The members of the round that follows."""
        return [n for n in members if n not in self.leaving]
