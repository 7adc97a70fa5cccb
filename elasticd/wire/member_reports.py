"""What a member tells the coordinator (docs/protocol.md §9.1): that it leaves, its rounds' steps, its answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from msgspec import Struct

from elasticd.wire.health import HealthReport
from elasticd.wire.names import MeshOp
from elasticd.wire.record import Record


@dataclass(frozen=True)
class Leave(Record):
    """`leave`: the node goes; `graceful` (its first signal) asks for its ranks to stop at one agreed step first."""

    reason: str = ""
    graceful: bool = False


class RoundReport(Struct, Record, frozen=True):
    """`node_done` (every worker of the node exited 0), `node_drained` and `pong`: about one round."""

    round: int | None = None


class FirstStep(Struct, Record, frozen=True):
    round: int
    at: float
    step: int | None = None


class StepReport(Struct, Record, frozen=True):
    """The answer to `step_query`: the node's highest shim step (null: no shim rank) and its median step time."""

    op_id: str
    step: int | None = None
    step_time: float | None = None
    in_place: bool = False


@dataclass(frozen=True)
class ResizeFailed(Record):
    round: int
    reason: str = ""


@dataclass(frozen=True)
class NodeAnswer(Record):
    """A node's answer to a `node_query`: the verb's reply, relayed to whoever asked."""

    id: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Empty(Record):
    """`announce` (warming up) and `warm` (pre-started workers wait for their generation): nothing but the op."""


TO_COORDINATOR: dict[str, type[Record]] = {
    MeshOp.announce: Empty, MeshOp.leave: Leave, MeshOp.node_done: RoundReport, MeshOp.node_drained: RoundReport,
    MeshOp.first_step: FirstStep, MeshOp.step_report: StepReport, MeshOp.pong: RoundReport,
    MeshOp.resize_failed: ResizeFailed, MeshOp.warm: Empty, MeshOp.node_answer: NodeAnswer,
    MeshOp.health: HealthReport,
}
