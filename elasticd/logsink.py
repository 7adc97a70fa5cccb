"""The daemon's log lines go out once per event-loop turn: a round's line per node in a few writes, not one each."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    _Base = logging.StreamHandler[TextIO]
else:  # StreamHandler takes a type argument at run time only from Python 3.11 on
    _Base = logging.StreamHandler


class TurnBufferedHandler(_Base):
    """Lines logged on the event loop are written together when the loop turn ends (`call_soon`); lines logged
    anywhere else (start-up, shutdown, another thread) are written at once, with what is pending before them.
    A write per line was an eighth of a 2,048-node coordinator's samples in a round; a SIGKILL loses one turn's lines.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.pending: list[str] = []
        self.scheduled: asyncio.AbstractEventLoop | None = None  # the loop whose turn-end writes them

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self.pending.append(line)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        if self.scheduled is not loop:  # (a loop that ended before its turn did is replaced; shutdown flushes)
            self.scheduled = loop
            loop.call_soon(self.flush)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            lines, self.pending, self.scheduled = self.pending, [], None
            if not lines:
                return
            try:
                self.stream.write("\n".join(lines) + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # stderr closed or gone: the daemon goes on without its log
                pass


class SecondCachedFormatter(logging.Formatter):
    """The default `asctime` (`2026-11-23 08:43:15,123`), its date and time formatted once per second."""

    def __init__(self, fmt: str) -> None:
        super().__init__(fmt)
        self.second, self.stamp = -1, ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self.second:
            self.second, self.stamp = second, time.strftime(self.default_time_format, self.converter(record.created))
        return f"{self.stamp},{int(record.msecs):03d}"


def configure(stream: TextIO) -> None:
    """INFO and up to `stream`, as `logging.basicConfig` would (nothing if the root logger has a handler)."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = TurnBufferedHandler(stream)
    handler.setFormatter(SecondCachedFormatter("%(asctime)s elasticd %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
