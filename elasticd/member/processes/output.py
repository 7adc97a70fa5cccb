"""A worker's output as it arrives: bounded lines for readers, its recent lines kept, its last traceback noted."""

from __future__ import annotations

from collections import deque

MAX_LINE_CHARS = 2000  # a line kept in memory or returned by `logs`; the log file keeps every byte
MAX_PENDING_BYTES = 64 * 1024  # a line longer than this (no newline yet) is passed on in pieces
RECENT_LINES = 200
TRACEBACK_LINES = 120
TRACEBACK_HEAD = "Traceback (most recent call last):"


def readable(raw: bytes) -> str:
    """One line for people: undecodable bytes replaced, control characters shown as `?`, cut to MAX_LINE_CHARS."""
    text = raw[: MAX_LINE_CHARS * 4].decode(errors="replace").rstrip("\r\n")
    if not text.isprintable():
        text = "".join(c if c.isprintable() or c == "\t" else "?" for c in text)
    if len(text) > MAX_LINE_CHARS or len(raw) > MAX_LINE_CHARS * 4:
        return f"{text[:MAX_LINE_CHARS]}… ({len(raw)} bytes)"
    return text


class OutputLines:
    """Splits a worker's output into lines, keeps the last RECENT_LINES, and the last traceback it printed."""

    def __init__(self) -> None:
        self.recent: deque[str] = deque(maxlen=RECENT_LINES)
        self.ends: deque[int] = deque(maxlen=RECENT_LINES)  # where each recent line ends in the output
        self.bytes = 0  # every byte seen: the log file's size, when nothing else writes it
        self._noted = 0  # bytes of the output split into lines so far
        self.traceback: list[str] = []  # the last complete one
        self._pending = b""
        self._reading: list[str] | None = None  # a traceback being printed

    def feed(self, chunk: bytes) -> list[tuple[bytes, str]]:
        """The complete lines (and over-long pieces) in `chunk`: raw, as printed, and readable."""
        self.bytes += len(chunk)
        data = self._pending + chunk
        pieces = data.split(b"\n")
        self._pending = pieces.pop()
        out = [piece + b"\n" for piece in pieces]
        if len(self._pending) > MAX_PENDING_BYTES:
            out.append(self._pending)
            self._pending = b""
        return [self.note(raw) for raw in out]

    def flush(self) -> list[tuple[bytes, str]]:
        """The last line, when the output ended without a newline."""
        rest, self._pending = self._pending, b""
        lines = [self.note(rest)] if rest else []
        self.end_traceback()
        return lines

    def note(self, raw: bytes) -> tuple[bytes, str]:
        text = readable(raw)
        self._noted += len(raw)
        self.recent.append(text)
        self.ends.append(self._noted)
        if text == TRACEBACK_HEAD:
            self.end_traceback()
            self._reading = [text]
        elif self._reading is not None:
            if len(self._reading) < TRACEBACK_LINES:
                self._reading.append(text)
            if text and not text[:1].isspace():  # `ValueError: …`: the exception line ends it
                self.end_traceback()
        return raw, text

    def since(self, offset: int) -> list[str]:
        """The recent lines that end after byte `offset`: a follower's next lines when the log file is gone."""
        return [text for text, end in zip(self.recent, self.ends, strict=True) if end > offset]

    def end_traceback(self) -> None:
        if self._reading is not None and len(self._reading) > 1:
            self.traceback = self._reading
        self._reading = None
