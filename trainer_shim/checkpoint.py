"""Checksummed, atomic checkpoint files: keep-last-K, newest-valid resume, optional background save."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

MAGIC = b"ESHIMCK1"  # 8 bytes, then the sha256 of the payload (32 bytes), then torch.save's bytes
_NAME = re.compile(r"^ckpt-(\d{8,})\.pt$")


class Reporter(Protocol):
    def report_checkpoint(self, step: int, path: str, nbytes: int, duration_s: float,
                          request_id: str | None = None) -> None: ...

    def report_skipped(self, path: str, reason: str) -> None: ...


class CorruptCheckpoint(Exception):
    """The file is torn, truncated or fails its checksum."""


@dataclass
class SaveResult:
    step: int
    path: str
    nbytes: int
    duration_s: float
    request_id: str | None = None


@dataclass
class Loaded:
    step: int
    path: str
    state: Any


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}.pt"


def fsync_dir(path: str) -> None:
    # The rename is durable only once the directory entry itself reaches the disk.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, *chunks: bytes | memoryview) -> None:
    """Temp file in the same directory, flush+fsync, os.replace, fsync the directory."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp.{os.getpid()}.{threading.get_ident()}")
    try:
        with open(tmp, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def to_cpu(obj: Any) -> Any:
    """A detached CPU copy of every tensor, so training may go on mutating the originals."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def save_file(state: Any, path: str) -> int:
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getbuffer()
    write_atomic(path, MAGIC, hashlib.sha256(payload).digest(), payload)
    return 40 + len(payload)


def load_file(path: str, map_location: Any = "cpu", weights_only: bool = True) -> Any:
    """Verify the header and checksum before unpickling anything; raises CorruptCheckpoint."""
    with open(path, "rb") as fh:
        data = fh.read()
    if len(data) < 40 or data[:8] != MAGIC:
        raise CorruptCheckpoint(f"{path}: bad header ({len(data)} bytes)")
    payload = memoryview(data)[40:]
    if hashlib.sha256(payload).digest() != data[8:40]:
        raise CorruptCheckpoint(f"{path}: sha256 mismatch")
    try:
        return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=weights_only)
    except Exception as exc:  # checksum fine but unreadable: still not a usable checkpoint
        raise CorruptCheckpoint(f"{path}: {exc}") from exc


def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """(step, path) oldest first; temp files and foreign names are ignored."""
    if not os.path.isdir(directory):
        return []
    found = [(int(m.group(1)), os.path.join(directory, n)) for n in os.listdir(directory)
             if (m := _NAME.match(n))]
    return sorted(found)


def load_latest(directory: str, session: Reporter | None = None, map_location: Any = "cpu",
                weights_only: bool = True) -> Loaded | None:
    """The newest valid checkpoint; torn or corrupt ones are skipped and reported as checkpoint_skipped."""
    for step, path in reversed(list_checkpoints(directory)):
        try:
            return Loaded(step, path, load_file(path, map_location, weights_only))
        except (CorruptCheckpoint, OSError) as exc:
            if session is not None:
                session.report_skipped(path, str(exc))
    return None


class Checkpointer:
    """Saves `ckpt-<step>.pt` into one directory, keeps the newest `keep`, reports each completed save."""

    def __init__(self, directory: str, keep: int = 3, session: Reporter | None = None,
                 background: bool = False) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory, self.keep, self.session, self.background = directory, keep, session, background
        os.makedirs(directory, exist_ok=True)
        self.last: SaveResult | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, state: Any, step: int, request_id: str | None = None) -> SaveResult | None:
        """Synchronous: returns the result. Background: snapshots to CPU, returns None; see wait()."""
        self.wait()  # at most one save in flight; it also surfaces the previous one's error
        if not self.background:
            return self._save(state, step, request_id)
        snapshot = to_cpu(state)  # taken now, on the caller's thread, before training mutates it
        self._thread = threading.Thread(target=self._run, args=(snapshot, step, request_id),
                                        name=f"ckpt-{step}", daemon=True)
        self._thread.start()
        return None

    def _run(self, state: Any, step: int, request_id: str | None) -> None:
        try:
            self._save(state, step, request_id)
        except BaseException as exc:
            self._error = exc

    def _save(self, state: Any, step: int, request_id: str | None) -> SaveResult:
        start = time.perf_counter()
        path = os.path.join(self.directory, checkpoint_name(step))
        nbytes = save_file(state, path)
        result = SaveResult(step, path, nbytes, time.perf_counter() - start, request_id)
        self.last = result
        self.prune(keep_path=path)
        if self.session is not None:
            self.session.report_checkpoint(step, path, nbytes, result.duration_s, request_id)
        return result

    def prune(self, keep_path: str | None = None) -> None:
        """Delete the oldest beyond `keep`, never the file just written (older steps follow a resume)."""
        others = [p for _, p in list_checkpoints(self.directory) if p != keep_path]
        excess = len(others) + (keep_path is not None) - self.keep
        for path in others[: max(excess, 0)]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> SaveResult | None:
        """Block until the background save (if any) is done; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        return self.last
