"""A node's health verdict (`health`, member -> coordinator; docs/health.md): which checks ran, which failed, why."""

from __future__ import annotations

from msgspec import Struct, field

from elasticd.wire.names import HealthCheck
from elasticd.wire.record import Record


class HealthFinding(Struct, Record, frozen=True):
    """One failed check: its name, and one line saying what it saw."""

    check: HealthCheck
    reason: str


class HealthReport(Struct, Record, frozen=True):
    """The node's checks (names) and what failed; healthy when nothing did."""

    checks: list[HealthCheck] = field(default_factory=list)
    findings: list[HealthFinding] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.findings

    def reasons(self) -> list[str]:
        return [f"{f.check}: {f.reason}" for f in self.findings]
