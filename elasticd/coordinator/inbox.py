"""What each message from a member does: decoded once into its record, then handed to the part that acts on it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from elasticd.coordinator.health import NodeHealth
from elasticd.coordinator.membership import NodeRecord
from elasticd.coordinator.probes import FailureProbe
from elasticd.coordinator.registration import Registration
from elasticd.coordinator.resize import Resizer
from elasticd.coordinator.round_progress import RoundTracker
from elasticd.coordinator.transitions import Transitions
from elasticd.wire.member_reports import TO_COORDINATOR, Leave, RoundReport
from elasticd.wire.member_state import STATE_REPORTS, EventReport
from elasticd.wire.names import MeshOp, NodeStatus
from elasticd.wire.protocol import Envelope, ProtocolError
from elasticd.wire.record import Record

log = logging.getLogger("elasticd")
Handler = Callable[[str, Any, float], None]  # (sender, its record, now)
Decoder = Callable[[object, int | None], Record]  # (body, its frame's size) -> its record (Record.decoder)
RECORDS: dict[str, type[Record]] = {**TO_COORDINATOR, **STATE_REPORTS}  # every op from a member, by its record


class Parts(Protocol):
    """The coordinator as its inbox sees it: the parts that act on a member's word, and what it does itself."""

    registration: Registration
    transitions: Transitions
    probe: FailureProbe
    tracker: RoundTracker
    resizer: Resizer
    health: NodeHealth

    def leave(self, node_id: str, leave: Leave, now: float) -> None: ...
    def node_done(self, node_id: str, done: RoundReport, now: float) -> None: ...
    def first_step(self, node_id: str, round_id: int, at: float, step: int | None) -> None: ...
    def adopt(self, event: EventReport, node: str) -> None: ...
    def resize_failed(self, round_id: int, reason: str, now: float) -> None: ...


def handlers(c: Parts) -> dict[str, tuple[Decoder, Handler]]:
    """Which part of the coordinator each op goes to, with its record's decoder."""
    return {op: (RECORDS[op].decoder(op), handler) for op, handler in _parts(c).items()}


def _parts(c: Parts) -> dict[str, Handler]:
    reg, trans, probe, tracker = c.registration, c.transitions, c.probe, c.tracker
    return {
        MeshOp.register: reg.on_register,
        MeshOp.announce: lambda sender, _body, now: reg.announce(sender, now),
        MeshOp.hb: reg.on_heartbeat,
        MeshOp.leave: c.leave,
        MeshOp.worker_failed: probe.worker_failed,
        MeshOp.node_done: c.node_done,
        MeshOp.node_drained: lambda sender, _body, now: trans.node_drained(sender, now),
        MeshOp.round_progress: lambda sender, report, _now: tracker.round_progress(sender, report),
        MeshOp.first_step: lambda sender, msg, _now: c.first_step(sender, msg.round, msg.at, msg.step),
        MeshOp.step_report: lambda sender, msg, _now: trans.on_step_report(sender, msg),
        MeshOp.pong: lambda sender, _body, now: probe.pong(sender, now),
        MeshOp.event: lambda sender, event, _now: c.adopt(event, sender),
        MeshOp.warm: lambda sender, _body, _now: c.resizer.warm(sender),
        MeshOp.resize_failed: lambda _sender, msg, now: c.resize_failed(msg.round, msg.reason, now),
        MeshOp.health: c.health.on_report,
    }


def receive(table: dict[str, tuple[Decoder, Handler]], nodes: dict[str, NodeRecord], sender: str, env: Envelope,
            now: float) -> None:
    """One message from a member (or this daemon's own node), dispatched by op."""
    entry = table.get(env.op)
    if entry is None:
        log.warning("mesh: unknown op %r from %s dropped", env.op, sender)
        return
    node = nodes.get(sender)
    if node is not None and now > node.last_seen and node.status == NodeStatus.alive \
            and env.op not in (MeshOp.register, MeshOp.announce):
        node.last_seen = now  # any frame is a sign of life, not only a heartbeat
    decoder, handler = entry
    message = decode(sender, env, decoder)
    if message is None:
        return
    try:
        handler(sender, message, now)
    except Exception as exc:  # one frame, however odd, must never end the coordinator's mesh loop
        log.warning("mesh: malformed %r from %s dropped: %r", env.op, sender, exc)


def decode(sender: str, env: Envelope, decoder: Decoder | None = None) -> Record | None:
    """The record of a member's message; None, said in a warning, for a malformed one."""
    try:
        return decoder(env.body, env.size) if decoder else RECORDS[env.op].decode(env.body, env.op, env.size)
    except ProtocolError as err:
        log.warning("mesh: malformed %s from %s dropped: %s", env.op, sender, err.reason)
        return None
