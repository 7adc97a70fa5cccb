"""What this node's workers printed and where they are now: `logs` and `stacks` answered on the node itself."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO, cast

from elasticd.job.config import JobConfig
from elasticd.member.processes import stack_dumps, zygote
from elasticd.member.processes.output import RECENT_LINES, readable
from elasticd.member.processes.workers import Worker, WorkerGroup
from elasticd.wire.diagnosis import StackDump, main_thread_where
from elasticd.wire.protocol import ErrorCode, ProtocolError
from elasticd.wire.read_replies import LogEntry, LogsReply, StackEntry, StacksReply

MAX_TAIL_LINES = 1000
TAIL_WINDOW_BYTES = 256 * 1024  # how far back a tail reads: a 10 MB line gives its end, not the whole line
FOLLOW_BYTES = 64 * 1024  # one poll of a follower: 4 polls a second caps a follower at 256 KB/s
FOLLOW_BEHIND_BYTES = 1024 * 1024  # a follower further behind than this skips ahead, and is told how much
STACK_REPLY_CHARS = 64 * 1024
ZYGOTE_FILE = f'File "{zygote.__file__}"'


class WorkerOutput:
    """Reads the logs of the rounds this node still remembers (its last groups), and dumps its workers' stacks."""

    def __init__(self, cfg: JobConfig, groups: Callable[[], Iterable[WorkerGroup]]) -> None:
        self.cfg = cfg
        self.groups = groups  # newest last

    @property
    def node_id(self) -> str:
        return self.cfg.node_id

    # ---- logs --------------------------------------------------------------------------------
    def output(self, rank: int | None, round_id: int | None, tail: int, since: int | None) -> LogsReply:
        round_id, workers = self.find(rank, round_id)
        tail = max(0, min(tail, MAX_TAIL_LINES))
        return LogsReply(node=self.node_id, round=round_id,
                         ranks=[self.read(worker, path, tail, since) for worker, path in workers])

    def find(self, rank: int | None, round_id: int | None) -> tuple[int, list[tuple[Worker | None, Path]]]:
        """The round asked for (the newest by default) and its workers (one rank, or all), each with its log."""
        groups = list(self.groups())
        if round_id is None:
            if not groups:
                raise ProtocolError(ErrorCode.NOT_FOUND, f"node {self.node_id} has started no workers yet")
            round_id = groups[-1].round_id
        group = next((g for g in reversed(groups) if g.round_id == round_id), None)
        known = sorted(group.workers, key=lambda w: w.rank) if group else []
        found: list[tuple[Worker | None, Path]] = [(w, w.log_path) for w in known if rank in (None, w.rank)]
        if not found and rank is not None:  # a round this daemon no longer holds in memory: its file, if kept
            path = self.round_folder(round_id) / f"rank-{rank}.log"
            if path.exists():
                found = [(None, path)]
        if not found:
            held = ",".join(str(w.rank) for w in known) or "none"
            what = f"rank {rank}" if rank is not None else "workers"
            raise ProtocolError(ErrorCode.NOT_FOUND, f"node {self.node_id} has no {what} in round {round_id} "
                                f"(its ranks there: {held})")
        return round_id, found

    def round_folder(self, round_id: int) -> Path:
        return Path(self.cfg.log_dir) / self.cfg.job_id / self.cfg.node_id / f"round-{round_id:04d}"

    def read(self, worker: Worker | None, path: Path, tail: int, since: int | None) -> LogEntry:
        entry: LogEntry = {"path": str(path), "source": "file", "note": "", "skipped": 0}
        if worker is not None:
            entry.update({"rank": worker.rank, "pid": worker.proc.pid, "state": worker.status,
                          "exit_code": worker.exit_code})
        else:
            entry.update({"rank": int(path.stem.removeprefix("rank-")), "pid": None, "state": "unknown",
                          "exit_code": None})
        try:
            with open(path, "rb") as handle:
                size = handle.seek(0, os.SEEK_END)
                if since is None:
                    start = max(0, size - TAIL_WINDOW_BYTES)
                    handle.seek(start)
                    lines = split(handle.read(), whole_first=start == 0)[-tail:] if tail else []
                    entry.update({"lines": lines, "offset": size})
                else:
                    entry.update(self.follow(handle, size, since))
        except OSError as err:  # deleted or unreadable: what the daemon still holds in memory
            held = held_lines(worker, tail, since)
            entry.update({"lines": held, "offset": worker.output.bytes if worker else 0, "source": "memory",
                          "note": f"log file unreadable ({err.strerror or err}): lines from the daemon's memory "
                          f"(its last {RECENT_LINES})"})  # the same words each poll: a follower says them once
        return entry

    @staticmethod
    def follow(handle: BinaryIO, size: int, since: int) -> LogEntry:
        """The complete lines written after byte `since`, at most FOLLOW_BYTES; far behind, it skips ahead."""
        since = min(max(0, since), size)  # a file that shrank (truncated by hand) goes on from its end
        skipped = 0
        if size - since > FOLLOW_BEHIND_BYTES:
            handle.seek(size - FOLLOW_BYTES)
            skipped = size - FOLLOW_BYTES + handle.read(FOLLOW_BYTES).find(b"\n") + 1 - since  # to a line's start
            since += skipped
        handle.seek(since)
        data = handle.read(FOLLOW_BYTES)
        cut = data.rfind(b"\n") + 1  # a line still being written waits for its end...
        if cut == 0 and len(data) == FOLLOW_BYTES:
            cut = len(data)  # ...unless it is longer than a poll: then it passes in pieces
        return {"lines": split(data[:cut], whole_first=True), "offset": since + cut, "skipped": skipped}

    # ---- stacks ------------------------------------------------------------------------------
    async def stacks(self, rank: int | None) -> StacksReply:
        """Every thread's Python stack of the newest round's workers (or one rank); a live rank goes on running."""
        round_id, found = self.find(rank, None)
        dumps = await asyncio.gather(*(self.dump(worker) for worker, _path in found if worker is not None))
        return StacksReply(node=self.node_id, round=round_id,
                           ranks=[cast(StackEntry, d.body(STACK_REPLY_CHARS)) for d in dumps])

    async def dump(self, worker: Worker) -> StackDump:
        path = worker.stacks_file
        if path is None:
            return StackDump(worker.rank, worker.proc.pid, note="not forked by the zygote (--no-python, or the "
                             "zygote was not ready): no stack dump was arranged; try py-spy dump --pid")
        if worker.exit_code is not None:
            text = without_launcher(last_dump(path))
            note = "the process has exited; its last dump" if text else "the process has exited; no dump was taken"
            return StackDump(worker.rank, worker.proc.pid, main_thread_where(text), text, note)
        text, note = await stack_dumps.capture(worker.proc.pid, path)
        text = without_launcher(text)
        return StackDump(worker.rank, worker.proc.pid, main_thread_where(text), text, note)


def held_lines(worker: Worker | None, tail: int, since: int | None) -> list[str]:
    """What the daemon holds in memory for a reader: the lines past a follower's offset, or the last `tail`."""
    if worker is None:
        return []
    if since is not None:
        return worker.output.since(since)
    return list(worker.output.recent)[-tail:] if tail else []


def split(data: bytes, whole_first: bool) -> list[str]:
    """Readable lines; without `whole_first` the first is the end of a line begun earlier, shown after `…`."""
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    texts = [readable(line) for line in lines]
    if not whole_first and texts:
        texts[0] = f"…{texts[0]}"  # the end of a longer line (a 10 MB line's last 256 KB): said, not dropped
    return texts


def without_launcher(dump: str) -> str:
    """A dump without the frames that run every script (the zygote's, runpy's): they say nothing of where it is."""
    return "\n".join(line for line in dump.splitlines()
                     if not (line.startswith('  File "<frozen runpy>"') or ZYGOTE_FILE in line))


def last_dump(path: Path) -> str:
    """The newest dump in a stacks file: what follows its last marker (stack_dumps.capture writes one each time)."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - stack_dumps.MAX_DUMP_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return text.rsplit(stack_dumps.MARKER, 1)[-1].partition("\n")[2].strip() if stack_dumps.MARKER in text else ""
