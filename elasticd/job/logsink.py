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
        self.queue(line)

    def queue(self, line: str) -> None:
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
        self.fmt = fmt
        self.second, self.stamp = -1, ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return self.asctime(record.created, record.msecs)

    def asctime(self, created: float, msecs: float) -> str:
        second = int(created)
        if second != self.second:
            self.second, self.stamp = second, time.strftime(self.default_time_format, self.converter(created))
        return f"{self.stamp},{int(msecs):03d}"

    def line(self, message: str, created: float) -> str:
        """What `format` makes of an INFO record of `message` logged at `created` (our format has no other field)."""
        return self.fmt % {"asctime": self.asctime(created, (created - int(created)) * 1000), "message": message}


_ONLY: TurnBufferedHandler | None = None  # configure()'s handler, while the root logger has no other


def info(logger: logging.Logger, message: str) -> None:
    """`logger.info(message)`, queued on our handler directly when nothing else could see the record: a job event's
    line (a 2,048-node round logs two per node) spends most of its time building a LogRecord otherwise."""
    handler, root = _ONLY, logging.getLogger()
    if handler is None or logger.handlers or logger.filters or root.filters or len(root.handlers) != 1 \
            or root.handlers[0] is not handler or not logger.propagate or not logger.isEnabledFor(logging.INFO):
        logger.info(message)
        return
    formatter = handler.formatter
    assert isinstance(formatter, SecondCachedFormatter)
    handler.queue(formatter.line(message, time.time()))


def configure(stream: TextIO) -> None:
    """INFO and up to `stream`, as `logging.basicConfig` would (nothing if the root logger has a handler)."""
    root = logging.getLogger()
    if root.handlers:
        return
    global _ONLY
    handler = TurnBufferedHandler(stream)
    handler.setFormatter(SecondCachedFormatter("%(asctime)s elasticd %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    _ONLY = handler
