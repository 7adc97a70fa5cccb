"""Node health on the coordinator: a sick node or a lemon is cordoned (gracefully when in the round), a spare fills in.

docs/health.md. Nodes judge their own checks (member/health.py) and report verdicts; this decides what to do:
take the node out where that helps, say why where it cannot, and never let it back without the operator.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container
from typing import Protocol

from elasticd.coordinator.core import CoordinatorCore, PendingRound
from elasticd.wire.health import HealthReport
from elasticd.wire.names import After, Cause, EventKind, HealthCheck, JobState, NodeStatus, Role, TransitionKind
from elasticd.wire.protocol import JsonObject

CORDON = "cordon: it leaves at one agreed step; a spare takes its place if the job has one"
CORDONED = "cordoned: it is not in the round"
LEFT_OUT = "cordoned: the round its failure starts leaves it out; a spare takes its place if the job has one"
AFTER_CHANGE = "cordon after the change in flight"
HOSTS_COORDINATOR = "stays: it hosts the coordinator (its leaving would end the job)"
BELOW_MIN = "stays until a spare comes: the job would fall below --nnodes min without one"


class HealthCore(CoordinatorCore, Protocol):
    """What health needs of the coordinator besides the core: the change in flight, and starting a cordon."""

    pending: PendingRound | None

    @property
    def transition(self) -> object | None: ...

    def begin_transition(self, kind: TransitionKind, leaving: list[str], final_role: Role, then: After,
                         detail: str, cause: Cause = Cause.membership) -> str: ...


class NodeHealth:
    """Each node's last verdict, the failures counted against it, and the cordons still to start."""

    def __init__(self, core: HealthCore, warming: Container[str]) -> None:
        self.core = core
        self.warming = warming  # the resizer's joiners whose pre-started workers are still starting: not ready
        self.reports: dict[str, HealthReport] = {}  # each node's own last verdict
        self.failures: dict[str, deque[float]] = {}
        self.lemons: dict[str, str] = {}  # node -> why it is a lemon: said while it stays cordoned
        self.due: dict[str, list[str]] = {}  # node -> reasons: cordon once the change in flight is over

    # ---- verdicts ---------------------------------------------------------------------------------------
    def on_report(self, node_id: str, report: HealthReport, now: float) -> None:
        before = self.reports.get(node_id)
        self.reports[node_id] = report
        if report.healthy:
            self.due.pop(node_id, None)
            if before is not None and not before.healthy:
                self.core.emit(EventKind.node_healthy, node_id, checks=[str(c) for c in report.checks],
                               role=self.role(node_id))
            return
        if before is None or before.reasons() != report.reasons():
            self.take_out(node_id, report.reasons())

    def failure_charged(self, node_id: str, now: float) -> None:
        """A worker failure that is its round's root cause counts against its node: K within the window, a lemon."""
        cfg = self.core.cfg
        if cfg.lemon_failures <= 0 or node_id not in self.core.nodes:
            return
        times = self.failures.setdefault(node_id, deque())
        times.append(now)
        while times and now - times[0] > cfg.lemon_window_s:
            times.popleft()
        if len(times) >= cfg.lemon_failures:
            times.clear()
            # Apart from the node's own verdict: its next passing check must not clear the coordinator's.
            self.lemons[node_id] = (f"{HealthCheck.lemon}: {cfg.lemon_failures} root-cause failures within "
                                    f"{cfg.lemon_window_s:g}s")
            self.take_out(node_id, [self.lemons[node_id]], failed=True)

    def check(self, _now: float) -> None:
        """Each tick: the cordons that waited for a change in flight, or for a spare to let the node go."""
        for node_id, reasons in list(self.due.items()):
            if self.core.transition is not None or self.core.pending is not None:
                return
            if self.interlock(node_id) != BELOW_MIN:
                del self.due[node_id]
                self.take_out(node_id, reasons)

    # ---- taking a node out ----------------------------------------------------------------------------------
    def take_out(self, node_id: str, reasons: list[str], failed: bool = False) -> None:
        """`failed`: its round already failed (a lemon), so the round that follows leaves it out, no drain."""
        core = self.core
        node = core.nodes.get(node_id)
        if node is None or node.status != NodeStatus.alive or node.role == Role.cordoned:
            return
        rnd = core.round
        in_round = rnd is not None and rnd.has(node_id) and core.state == JobState.running
        action = self.interlock(node_id) if in_round else ""
        if action == BELOW_MIN or (not action and in_round and not failed
                                   and (core.transition is not None or core.pending is not None)):
            self.due[node_id] = reasons  # tried again each tick: once the change is over, or a spare has come
            action = action or AFTER_CHANGE
        elif not action and in_round and not failed:
            core.begin_transition(TransitionKind.cordon, [node_id], Role.cordoned, After.round,
                                  f"cordon of {node_id}: unhealthy ({'; '.join(reasons)})")
            action = CORDON
        elif not action:
            node.role = Role.cordoned
            core.emit(EventKind.node_role, node_id, role=Role.cordoned)
            action = LEFT_OUT if in_round else CORDONED
        core.emit(EventKind.node_unhealthy, node_id, reasons=reasons, action=action)

    def interlock(self, node_id: str) -> str:
        """Why a node of the round must stay despite its health; empty when it may go."""
        core = self.core
        if node_id == core.cfg.node_id:
            return HOSTS_COORDINATOR
        rnd = core.round
        staying = len(rnd.node_ids()) - 1 if rnd is not None else 0
        if staying < core.cfg.min_nodes and staying + len(self.spares()[0]) < core.cfg.min_nodes:
            return BELOW_MIN  # the spares are counted only where they matter: a tick retries a held node
        return ""

    # ---- what status and the console read ------------------------------------------------------------------
    def spares(self) -> tuple[list[str], list[str]]:
        """Standby nodes that could take a place now (ready: their checks passed), and those whose workers are
        still starting or whose first checks have not reported yet."""
        ready: list[str] = []
        warming: list[str] = []
        for node in self.core.alive():
            if node.role == Role.standby and not self.unhealthy(node.node_id):
                (ready if not self.warming_because(node.node_id) else warming).append(node.node_id)
        return ready, warming

    def warming_because(self, node_id: str) -> str:
        """Why a healthy standby node is not a ready spare yet ("" when it is)."""
        if node_id in self.warming:
            return "workers starting"
        return "" if node_id in self.reports else "health checks pending"

    def unhealthy(self, node_id: str) -> bool:
        report = self.reports.get(node_id)
        return report is not None and not report.healthy

    def role(self, node_id: str) -> str:
        node = self.core.nodes.get(node_id)
        return str(node.role) if node else ""

    def reasons(self, node_id: str) -> list[str]:
        """Why a node is out: its own checks' reasons, and the coordinator's lemon verdict while it is cordoned."""
        report = self.reports.get(node_id)
        own = report.reasons() if report else []
        lemon = self.lemons.get(node_id) if self.role(node_id) == Role.cordoned else None
        return [*own, lemon] if lemon else own

    def node_fields(self, node_id: str) -> JsonObject:
        """A node's entry in `status`: its checks, why it is unhealthy, and whether it is a spare ready to go."""
        report = self.reports.get(node_id)
        fields: JsonObject = {"checks": [str(c) for c in report.checks] if report else [],
                              "health": self.reasons(node_id)}
        node = self.core.nodes.get(node_id)
        if node is not None and node.role == Role.standby and node.status == NodeStatus.alive:
            why = self.warming_because(node_id)
            fields["spare"] = f"warming: {why}" if why else "ready"
        return fields

    def summary(self) -> JsonObject:
        ready, warming = self.spares()
        return {"spares": {"ready": len(ready), "warming": len(warming)},
                "unhealthy": sorted(n for n in {*self.reports, *self.lemons} if self.reasons(n))}
