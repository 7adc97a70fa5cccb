"""Graceful membership changes: what a transition is, the events that mark its life, and the part that runs it.

Shim workers stop at one agreed step (step_agreement.py), plain ones get SIGTERM; then the job re-forms without the
leaving nodes, or ends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from elasticd.coordinator.core import CoordinatorCore, PendingRound
from elasticd.coordinator.resize import Resizer
from elasticd.coordinator.step_agreement import WORKER_OPS, StepAgreement, StepQuery
from elasticd.wire.assignment import ResizeRequest, WorkerRequest
from elasticd.wire.member_reports import StepReport
from elasticd.wire.names import After, Cause, EventKind, JobState, MeshOp, NodeStatus, Role, StepRequest, TransitionKind
from elasticd.wire.protocol import new_id

log = logging.getLogger("elasticd")

DRAIN_TIMEOUT_S = 30.0  # past this, a transition completes without the ranks that never said `drained`
# A scheduler signals every node of a job at once (SLURM's time limit or --signal, a Kubernetes job deleted): a
# transition begun by a signal waits this long before it asks for the step, so that the other nodes' signals fold
# into it and the whole job stops at one agreed step with a checkpoint (docs/architecture.md, "Job-wide signals").
SIGNAL_WINDOW_S = 0.2
# An operator's drain or cordon asks for the step once no node is warming (WARM_TIMEOUT_S at most), the spare that
# takes the leaving node's place among them: asked earlier, the round after it held every rank until that spare
# was up. A leave begun by a signal never waits: its node's grace is running.
TAKES_A_SPARE = frozenset({TransitionKind.drain, TransitionKind.cordon})


@dataclass(frozen=True)
class TransitionEvents:
    """The event kinds that mark one kind of transition's life."""

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


class TransitionCore(CoordinatorCore, Protocol):
    """What a transition needs of the coordinator besides the core: in-place rounds, and the round or end after."""

    resizer: Resizer

    def end(self, state: JobState, reason: str, now: float) -> None: ...

    def schedule(self, cause: Cause, detail: str, detected_at: float, due: float | None = None) -> None: ...

    def start_pending_round(self, now: float) -> None: ...

    def remove(self, node_id: str, status: NodeStatus, detail: str, now: float, reform: bool = True) -> None: ...

    def round_lost_a_member(self) -> bool: ...


class Transitions:
    """Runs the graceful change in flight (at most one): begins it, asks for the step every rank stops at, counts
    the ranks that said `drained`, and completes it into a new round or the job's end; a round that cannot wait
    abandons it. Leaves that arrive meanwhile fold into it (one agreed step for a job-wide signal)."""

    def __init__(self, core: TransitionCore) -> None:
        self.core = core
        self.current: Transition | None = None
        self.agreement = StepAgreement(core.send_all)
        self.reformed = False  # the workers already stopped gracefully for the pending round
        self.stop_after_round = ""  # why the job stops once the round in place that follows takes its first step

    def begin(self, kind: TransitionKind, leaving: list[str], final_role: Role, then: After, detail: str,
              cause: Cause = Cause.membership, detected: float = 0.0, hold: float = 0.0) -> str:
        """Shim workers stop at one agreed step, plain ones get SIGTERM; returns the op id.

        `hold` delays the step's question (a signal's window: more leaves may fold in first)."""
        core = self.core
        assert core.round is not None
        op_id, now = new_id(), core.clock()
        for node_id in leaving:
            core.nodes[node_id].role = Role.draining
            core.emit(EventKind.node_role, node_id, role=Role.draining)
        # Every member is awaited until the step agreement says otherwise: with no shim worker anywhere
        # (at_step null) there is nothing to wait for, and the round's SIGTERM stops the plain workers.
        trans = Transition(op_id, kind, leaving, final_role, then, set(core.round.node_ids()),
                           now + DRAIN_TIMEOUT_S, detected or now, cause, detail)
        self.current = trans
        core.emit(trans.events.started, op_id=op_id, nodes=leaving, detail=detail)
        trans.ask_at = now + hold
        self.ask_when_due(now)  # `step_agreed` carries the step every rank stops at
        return op_id

    def ask_when_due(self, now: float) -> None:
        trans, core = self.current, self.core
        if trans is None or trans.asked or now < trans.ask_at:
            return
        if trans.kind in TAKES_A_SPARE and not trans.departing \
                and core.resizer.warming_up({n.node_id for n in core.alive()}, now):
            return  # a spare that may take the leaving node's place still loads: the job trains on meanwhile
        trans.asked, trans.deadline = True, max(trans.deadline, now + DRAIN_TIMEOUT_S)
        self.ask_step(trans.op_id, StepRequest.drain)

    def node_drained(self, node_id: str, now: float) -> None:
        trans = self.current
        if trans is not None and node_id in trans.awaiting:
            trans.awaiting.discard(node_id)
            self.core.emit(trans.events.progress, node_id, op_id=trans.op_id, remaining=sorted(trans.awaiting))
            self.finish_if_ready(now)

    def finish_if_ready(self, now: float) -> None:
        core, trans = self.core, self.current
        if trans is None or (trans.awaiting and now < trans.deadline):
            return
        self.current = None
        for node_id in trans.leaving:
            if node_id not in trans.departing:
                core.nodes[node_id].role = trans.final_role
                core.emit(EventKind.node_role, node_id, role=trans.final_role)
        core.emit(trans.events.complete, op_id=trans.op_id, nodes=trans.leaving, timed_out=bool(trans.awaiting),
                  duration_s=round(now - trans.started, 3))
        self.let_go(trans, now)
        if trans.then == After.end:
            core.end(JobState.stopped, f"{trans.detail} ({trans.op_id})", now)
        elif core.cfg.node_id in trans.departing:
            return  # our own node left (a handover on etcd): the next coordinator forms the round without it
        else:
            core.schedule(trans.cause, trans.detail, trans.started, due=now)
            self.reformed = True
            core.start_pending_round(now)  # at once, not at the next tick: the ranks wait for it

    def round_starts(self) -> None:
        """A round that starts anyway (a failure, a lost node) ends a graceful stop where it stands; the round after
        it restarts healthy workers only once they stopped at one step again."""
        trans, self.current = self.current, None
        if trans is not None:
            for node_id in trans.leaving:
                self.core.nodes[node_id].role = trans.final_role
            self.core.emit(trans.events.abandoned, op_id=trans.op_id, reason="a new round started first")
            self.let_go(trans, self.core.clock())
        self.reformed = False

    def let_go(self, trans: Transition, now: float) -> None:
        """The nodes that asked to leave are out: the round that follows is formed without them."""
        for node_id, reason in trans.departing.items():
            self.core.remove(node_id, NodeStatus.left, reason, now, reform=False)
            self.core.send(node_id, MeshOp.left, {"reason": reason})

    def reform_first(self, pending: PendingRound) -> bool:
        """Before a round that restarts healthy shim workers (a join, scale up, restart), stop them at one step.

        Returns True when it started that graceful stop; the round follows when every rank has saved and stopped.
        A round after a failure or a lost node cannot wait: its workers are failing already.
        """
        core = self.core
        if self.reformed or pending.cause not in (Cause.membership, Cause.operator):
            return False
        if core.state != JobState.running or core.round is None:
            return False
        if core.round_lost_a_member():
            return False
        self.begin(TransitionKind.reform, [], Role.active, After.round, pending.detail, pending.cause,
                   pending.detected_at)
        return True

    def ask_step(self, op_id: str, request: StepRequest) -> None:
        assert self.core.round is not None
        self.agreement.ask(op_id, request, self.core.round.node_ids(), self.core.clock())

    def on_step_report(self, sender: str, report: StepReport) -> None:
        query = self.agreement.answer(sender, report)
        if query is not None:
            self.resolve_step(query)

    def resolve_expired(self, now: float) -> None:
        for query in self.agreement.expired(now):
            self.resolve_step(query)

    def resolve_step(self, query: StepQuery) -> None:
        core = self.core
        if core.round is None or core.state != JobState.running:
            return
        at_step = query.at_step()
        trans = self.current
        ours = trans is not None and trans.op_id == query.op_id
        request = query.request
        all_stay = False
        # A handover (our own node departing, etcd) drains with a checkpoint: the next coordinator's round restarts.
        if ours and trans is not None and self.keeps_state_in_place(trans) and at_step is not None \
                and request == StepRequest.drain and core.resizer.agree(query, core.clock()):
            request = StepRequest.resize  # every rank leaves its group at that step and keeps its process
            trans.in_place = True
            # A join: no rank's shards leave the world, so none gathers first. A node that says it leaves once
            # this is agreed is folded in all the same: its shards with no replica are then missing, and the
            # ranks heal from the newest checkpoint (docs/architecture.md, "Healing").
            all_stay = not trans.leaving and not trans.departing
        core.emit(EventKind.step_agreed, op_id=query.op_id, op=request, at_step=at_step)
        if ours and trans is not None:  # no shim worker reports steps (there): nobody will say `drained`
            trans.awaiting = set() if at_step is None else trans.awaiting - query.plain
        # Every member is told, and only those with shim ranks are waited for. A node that answered with none may
        # be starting shim workers that say hello later: the request is theirs too (worker_channel.welcome).
        asked = ResizeRequest(query.op_id, at_step, all_stay) if request == StepRequest.resize \
            else WorkerRequest(query.op_id, at_step)
        core.send_all(core.round.node_ids(), WORKER_OPS[request], asked.encode())

    def keeps_state_in_place(self, trans: Transition) -> bool:
        """Whether a round follows that holds the ranks' state without a checkpoint: not when the job ends, our
        own node hands over (etcd), or fewer than --nnodes min stay (their workers would be stopped to wait)."""
        core = self.core
        assert core.round is not None
        return trans.then == After.round and core.cfg.node_id not in trans.departing \
            and len(trans.stays(core.round.node_ids())) >= core.cfg.min_nodes

    def drain_departing(self, node_id: str, reason: str) -> bool:
        """Fold a leaving node into the transition in flight, or drain it; False when no drain can be had."""
        core = self.core
        rnd = core.round
        if core.state != JobState.running or rnd is None or not rnd.has(node_id) \
                or node_id == core.cfg.node_id or core.nodes[node_id].status != NodeStatus.alive:
            return False
        if self.current is None:
            self.begin(TransitionKind.drain, [node_id], Role.standby, After.round,
                       f"node {node_id} leaving: {reason}", hold=SIGNAL_WINDOW_S)
        self.fold_departing(node_id, reason)
        return True

    def fold_departing(self, node_id: str, reason: str) -> None:
        """Several preemption notices at once (a job-wide signal): one transition, one agreed step for all."""
        trans = self.current
        assert trans is not None
        if trans.depart(node_id, reason):
            self.core.nodes[node_id].role = Role.draining
            self.core.emit(EventKind.node_role, node_id, role=Role.draining)

    def stop_gracefully(self, why: str) -> None:
        """The job ends once every shim rank saved at one agreed step: folded into a transition in flight.

        A transition whose ranks already agreed to resize in place saves nothing: the stop follows its round."""
        trans = self.current
        if trans is None:
            self.begin(TransitionKind.stop, [], Role.standby, After.end, why, hold=SIGNAL_WINDOW_S)
        elif trans.in_place:
            self.stop_after_round = why
        else:
            log.info("[%s] %s: folded into %s %s, which now ends the job", self.core.cfg.node_id, why, trans.kind,
                     trans.op_id)
            trans.then, trans.detail = After.end, why

    def stop_after_first_step(self) -> None:
        """The round in place that followed a stop's agreed resize took its first step: now the job stops."""
        if self.stop_after_round and self.current is None and self.core.state == JobState.running:
            why, self.stop_after_round = self.stop_after_round, ""
            self.begin(TransitionKind.stop, [], Role.standby, After.end, why)
