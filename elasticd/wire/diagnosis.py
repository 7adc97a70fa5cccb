"""Why a rank failed or where it hung, as it crosses the mesh and the API: typed records, decoded once.

Stdlib only (trainer_shim may import wire/). docs/protocol.md, "Diagnosis", is the reference.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from elasticd.wire.protocol import Json, JsonObject
from elasticd.wire.record import Record

MAX_TRACEBACK_CHARS = 4000  # an event's traceback: its head and its end, where the innermost frames are
MAX_MESSAGE_CHARS = 500
MAX_STACK_CHARS = 6000  # a hung rank's stack in its event; `elasticd stacks` returns more
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:,)? in (?P<function>.+?)\s*$')


def clip(text: str, limit: int) -> str:
    """At most `limit` characters: the head and the end, what was cut said in between."""
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 2)
    head, tail = text[: keep // 4], text[len(text) - (keep - keep // 4):]
    return f"{head}\n… ({len(text) - len(head) - len(tail)} characters cut) …\n{tail}"


@dataclass(frozen=True)
class Frame:
    """One line of a Python stack: file, line and function."""

    file: str
    line: int
    function: str

    @property
    def where(self) -> str:
        """`train.py:42 in step`: the file's name, its line, the function."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line} in {self.function}"


def frames_of(text: str) -> list[Frame]:
    """The `File "…", line N, in f` lines of a traceback or a faulthandler dump, in the order printed."""
    found = []
    for line in text.splitlines():
        match = _FRAME.match(line)
        if match:
            found.append(Frame(match["file"], int(match["line"]), match["function"]))
    return found


@dataclass(frozen=True)
class ErrorInfo(Record):
    """What a failed worker raised: from torch's error file (`@record`) or the last traceback in its output."""

    type: str
    message: str
    where: str = ""  # the innermost frame: `train.py:42 in step`
    file: str = ""
    line: int = 0
    traceback: str = ""
    source: str = "output"  # ERROR_FILE or OUTPUT

    def body(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Json) -> ErrorInfo | None:
        """None for anything that is not an error record (a member of an older version sends none)."""
        if not isinstance(body, dict) or not isinstance(kind := body.get("type"), str):
            return None
        line = body.get("line")
        return cls(kind, str(body.get("message", "")), str(body.get("where", "")), str(body.get("file", "")),
                   line if isinstance(line, int) and not isinstance(line, bool) else 0,
                   str(body.get("traceback", "")), str(body.get("source", "output"))).clipped()

    def clipped(self) -> ErrorInfo:
        """Within the sizes a failure's event and `status` carry."""
        return ErrorInfo(self.type[:200], self.message[:MAX_MESSAGE_CHARS], self.where[:300], self.file[:300],
                         self.line, clip(self.traceback, MAX_TRACEBACK_CHARS), self.source[:20])

    @classmethod
    def from_traceback(cls, text: str, source: str, headline: str = "") -> ErrorInfo | None:
        """A Python traceback's exception and innermost frame; `headline` (`Type: message`) when known apart."""
        lines = [line for line in text.splitlines() if line.strip()]
        if not headline:
            plain = [line for line in lines if not line[:1].isspace() and not line.startswith("Traceback (")]
            headline = plain[-1] if plain else ""
        if not headline and not lines:
            return None
        kind, _, message = headline.partition(": ")
        if not re.fullmatch(r"[\w.]+", kind):
            kind, message = "Error", headline
        frames = frames_of(text)
        inner = frames[-1] if frames else None
        return cls(kind, message.strip()[:MAX_MESSAGE_CHARS], inner.where if inner else "",
                   inner.file if inner else "", inner.line if inner else 0, clip(text.strip(), MAX_TRACEBACK_CHARS),
                   source)

    @property
    def summary(self) -> str:
        """`ValueError: bad batch at train.py:42 in step`."""
        text = f"{self.type}: {self.message}" if self.message else self.type
        return f"{text} at {self.where}" if self.where else text


ERROR_FILE = "error_file"
OUTPUT = "output"


@dataclass(frozen=True)
class Failure:
    """One rank's failure as a node reports it (`worker_failed`), and as events and `status` carry it."""

    node: str
    rank: int | None
    round: int
    exit_code: int | None = None
    signal: str = ""  # the signal that ended it: SIGKILL, SIGSEGV
    pid: int = 0
    at: float = 0.0  # when its daemon saw it exit
    error: ErrorInfo | None = None
    hang: bool = False
    reason: str = ""  # one line, as the round's detail says it
    log: str = ""  # the rank's log file on its node
    error_file: str = ""

    def body(self) -> JsonObject:
        body = asdict(self)
        body["error"] = self.error.body() if self.error else None
        return body

    def clipped(self) -> Failure:
        """Within the sizes its event and `status` carry."""
        return replace(self, signal=self.signal[:20], error=self.error.clipped() if self.error else None,
                       reason=self.reason[:1000], log=self.log[:500], error_file=self.error_file[:500])

    @classmethod
    def from_body(cls, node: str, body: Mapping[str, Json]) -> Failure:
        """A failure's body as `status` and `job_end` carry it; what is missing or mistyped is left at its default."""
        def whole(key: str) -> int | None:
            value = body.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def number(key: str) -> float | None:
            value = body.get(key)
            return value if isinstance(value, int | float) and not isinstance(value, bool) else None

        rank, code, pid = whole("rank"), whole("exit_code"), whole("pid")
        at = number("detected") or number("at") or 0.0
        return cls(node, rank, whole("round") or 0, code, str(body.get("signal") or ""), pid or 0, float(at),
                   ErrorInfo.from_body(body.get("error")), body.get("hang") is True, str(body.get("reason", "")),
                   str(body.get("log", "")), str(body.get("error_file", ""))).clipped()

    @property
    def who(self) -> str:
        return f"rank {self.rank} on node {self.node}" if self.rank is not None else f"node {self.node}"


@dataclass(frozen=True)
class StackDump:
    """A rank's Python stacks, every thread, as faulthandler wrote them; `where` is its main thread's innermost."""

    rank: int
    pid: int
    where: str = ""
    text: str = ""
    note: str = ""  # why there is no stack (not forked by the zygote, the process did not answer)

    def body(self, limit: int = MAX_STACK_CHARS) -> JsonObject:
        return {**asdict(self), "text": clip(self.text, limit)}

    def blocked(self) -> str:
        return blocked(self.where, self.note)


def blocked(where: str, note: str) -> str:
    """Where a stuck rank's stack says it was blocked, or why no stack was taken, to end a sentence about it."""
    return f", blocked at {where}" if where else f" (no stack: {note})" if note else ""


def main_thread_where(dump: str) -> str:
    """The innermost frame of the thread that took the signal (faulthandler prints it `Current thread`), else of
    the last thread printed, the oldest: the main thread, where a blocked script sits."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip())
    current = [b for b in blocks if b.startswith("Current thread")]
    for block in (current or blocks[-1:]):
        frames = frames_of(block)  # most recent call first
        if frames:
            return frames[0].where
    return ""
