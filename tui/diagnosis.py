"""A round's root cause, a rank's output and its stacks, typed from the daemon's replies and drawn as rich Text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

from elasticd.wire.diagnosis import Failure, StackDump


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


@dataclass(frozen=True)
class RankOutput:
    """One rank's entry of a `logs` reply: its process, and the lines read up to byte `offset` of its log."""

    rank: int | None
    pid: int | None = None
    state: str = ""
    exit_code: int | None = None
    path: str = ""
    note: str = ""
    skipped: int = 0
    offset: int = 0
    lines: list[str] = field(default_factory=list)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> RankOutput:
        lines = body.get("lines")
        return cls(whole(body.get("rank")), whole(body.get("pid")), str(body.get("state") or ""),
                   whole(body.get("exit_code")), str(body.get("path") or ""), str(body.get("note") or ""),
                   whole(body.get("skipped")) or 0, whole(body.get("offset")) or 0,
                   [str(line) for line in lines] if isinstance(lines, list) else [])

    @property
    def title(self) -> str:
        """`rank 1 (pid 1004, running)`, with the exit code of one that ended."""
        code = "" if self.exit_code is None else f", exit code {self.exit_code}"
        return f"rank {self.rank} (pid {self.pid}, {self.state or '?'}{code})"

    def text_lines(self, said: str = "") -> list[Text]:
        """What the log said, after why it comes from memory (unless `said` already) and how much a reader skipped."""
        notes = [Text(f"(log: {self.note})", style="dim")] if self.note and self.note != said else []
        if self.skipped:
            notes.append(Text(f"(… {self.skipped} bytes skipped: the output ran faster than this console reads …)",
                              style="yellow"))
        return [*notes, *(Text(line) for line in self.lines)]


def entries(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """A `logs` or `stacks` reply's per-rank records; anything else in the list is left out."""
    ranks = reply.get("ranks")
    return [entry for entry in ranks if isinstance(entry, dict)] if isinstance(ranks, list) else []


def rank_outputs(reply: dict[str, Any]) -> list[RankOutput]:
    return [RankOutput.from_body(entry) for entry in entries(reply)]


def tails_text(reply: dict[str, Any]) -> Text:
    """Each rank's last lines under a header naming it: node detail's tails."""
    text = Text()
    for entry in rank_outputs(reply):
        text.append(f"── {entry.title} ──\n", style="bold cyan")
        for line in entry.text_lines() or [Text("(no output yet)", style="dim")]:
            text.append_text(line).append("\n")
    text.rstrip()
    return text or Text("(no workers reported)", style="dim")


def dumps_of(reply: dict[str, Any]) -> list[StackDump]:
    """The `stacks` reply's dumps; a malformed entry is left out."""
    return [StackDump(body["rank"], whole(body.get("pid")) or 0, str(body.get("where") or ""),
                      str(body.get("text") or ""), str(body.get("note") or ""))
            for body in entries(reply) if whole(body.get("rank")) is not None]


def stacks_text(reply: dict[str, Any]) -> Text:
    """Each rank's dump under a header naming it and where its main thread is."""
    text = Text()
    for dump in dumps_of(reply):
        where = f" at {dump.where}" if dump.where else ""
        text.append(f"── rank {dump.rank} (pid {dump.pid}){where} ──\n", style="bold cyan")
        if dump.note:
            text.append(f"({dump.note})\n", style="dim")
        if dump.text:
            text.append(dump.text + "\n")
    text.rstrip()
    return text or Text("(no live ranks to dump)", style="dim")
