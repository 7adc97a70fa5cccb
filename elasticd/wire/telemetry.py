"""What a daemon publishes for consoles besides events (docs/protocol.md §6.3): its shim ranks' steps."""

from __future__ import annotations

from dataclasses import dataclass, field

from elasticd.wire.record import Record


@dataclass(frozen=True)
class StepRow(Record):
    """One shim rank's progress, as the console's rank table shows it (null: not reported yet)."""

    rank: int
    step: int | None = None
    loss: float | None = None
    throughput: float | None = None  # samples per second since its last report
    samples: int | None = None
    step_time: float | None = None
    last_step_at: float | None = None


@dataclass(frozen=True)
class StepTelemetry(Record):
    """`st.<node>/`, op `steps`: the node's round and its shim ranks, sent when a step moved (at most 4 a second)."""

    round: int | None = None
    ranks: list[StepRow] = field(default_factory=list)
