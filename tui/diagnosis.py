"""A round's root cause, typed from the daemon's `status`, said briefly for a table cell or in one line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elasticd.wire.diagnosis import Failure


def whole(value: Any) -> int | None:
    """A whole number from a reply, else None (a bool is no number here)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RootCause:
    """`status.root_cause`: the first failure of the newest failed round, and how many failures followed it."""

    failure: Failure
    consequences: int = 0

    @classmethod
    def from_body(cls, body: Any) -> RootCause | None:
        if not isinstance(body, dict) or not isinstance(body.get("node"), str):
            return None
        return cls(Failure.from_body(body["node"], body), whole(body.get("consequences")) or 0)

    @property
    def ending(self) -> str:
        """How the rank ended when it raised no Python error: hung, a signal, an exit code."""
        failure = self.failure
        if failure.hang:
            return "hung"
        if failure.signal:
            return f"killed by {failure.signal}"
        if failure.exit_code is not None:
            return f"exit code {failure.exit_code}"
        return failure.reason or "failed"

    @property
    def brief(self) -> str:
        """`ValueError: bad batch at train.py:42`: what a table cell has room for."""
        error = self.failure.error
        if error is None:
            return self.ending
        text = f"{error.type}: {error.message}" if error.message else error.type
        place = f"{error.file.rsplit('/', 1)[-1]}:{error.line}" if error.file and error.line else error.where
        return f"{text} at {place}" if place else text

    @property
    def summary(self) -> str:
        """One line: the round, who failed, its error and function, and how many failures followed it."""
        failure = self.failure
        what = failure.error.summary if failure.error else self.ending
        text = f"root cause of round {failure.round}: {failure.who}: {what}"
        if failure.error is not None and (failure.signal or failure.exit_code is not None):
            text += f" ({self.ending})"
        if self.consequences:
            text += f"; {self.consequences} more failure(s) followed it"
        return text
