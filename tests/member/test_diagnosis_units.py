"""Diagnosis without a daemon: a worker's lines kept bounded, its traceback and torch's error file read, a
faulthandler dump's blocked frame, a follower far behind, and the root cause the coordinator names."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from elasticd.member.processes.output import MAX_LINE_CHARS, RECENT_LINES, OutputLines
from elasticd.member.worker_output import FOLLOW_BEHIND_BYTES, FOLLOW_BYTES, WorkerOutput, without_launcher
from elasticd.wire.diagnosis import ErrorInfo, Failure, main_thread_where

pytestmark = pytest.mark.quick

TRACEBACK = """Traceback (most recent call last):
  File "/job/train.py", line 50, in <module>
    main()
  File "/job/train.py", line 42, in step
    raise ValueError("bad batch 7")
ValueError: bad batch 7
"""


def test_lines_are_bounded_and_a_ten_megabyte_line_passes_in_pieces() -> None:
    out = OutputLines()
    lines = out.feed(b"x" * 10_000_000) + out.feed(b"\n\x00\xff\x1b[31mred\n")
    assert sum(len(raw) for raw, _ in lines) == 10_000_000 + 12  # every byte passed on, for the log
    assert all(len(text) <= MAX_LINE_CHARS + 30 for _, text in lines)
    assert lines[-1][1] == "?\ufffd?[31mred"  # binary shown, never raw control bytes
    for i in range(RECENT_LINES * 3):
        out.feed(f"line {i}\n".encode())
    assert len(out.recent) == RECENT_LINES and out.recent[-1] == f"line {RECENT_LINES * 3 - 1}"


def test_a_follower_of_a_deleted_log_gets_the_lines_past_its_offset_from_memory() -> None:
    out = OutputLines()
    out.feed(b"one\ntwo\nthr")
    offset = out.bytes  # where a follower stood: mid-line
    assert out.since(offset) == []
    out.feed(b"ee\nfour\n")
    assert out.since(offset) == ["three", "four"]  # the line being written then comes whole
    assert out.since(out.bytes) == [] and out.since(0) == ["one", "two", "three", "four"]


def test_the_last_traceback_printed_is_the_error() -> None:
    out = OutputLines()
    for chunk in (b"step 1\n", TRACEBACK.replace("bad batch 7", "first").encode(), b"step 2\n", TRACEBACK.encode(),
                  b"[rank1]: goodbye"):
        out.feed(chunk)
    out.flush()
    error = ErrorInfo.from_traceback("\n".join(out.traceback), "output")
    assert error is not None
    assert (error.type, error.message, error.where) == ("ValueError", "bad batch 7", "train.py:42 in step")
    assert error.summary == "ValueError: bad batch 7 at train.py:42 in step"


def test_torch_record_writes_what_the_error_file_reader_reads(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.elastic.multiprocessing.errors import record

    from elasticd.member.failures import read_error_file

    folder = tmp_path / "round-0001" / "0"
    folder.mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(folder / "error.json"))

    @record
    def main() -> None:
        raise KeyError("missing shard")

    with pytest.raises(KeyError):
        main()

    class Worker:  # only the error file's place is read
        error_file = folder / "error.json"

    error = read_error_file(Worker())  # type: ignore[arg-type]
    assert error is not None and error.type == "KeyError" and "missing shard" in error.message
    assert error.source == "error_file" and error.where.endswith("in main")
    (folder / "error.json").write_text("{not json")
    assert read_error_file(Worker()) is None  # type: ignore[arg-type]


def test_a_dump_names_the_main_threads_innermost_frame() -> None:
    dump = ('Thread 0x00007f01 (most recent call first):\n  File "/x/threading.py", line 320 in wait\n\n'
            'Thread 0x00007f00 (most recent call first):\n  File "/job/train.py", line 17 in wait_forever\n'
            '  File "/job/train.py", line 30 in main\n  File "<frozen runpy>", line 88 in _run_code\n')
    assert main_thread_where(dump) == "train.py:17 in wait_forever"
    assert "<frozen runpy>" not in without_launcher(dump)
    current = dump.replace("Thread 0x00007f01", "Current thread 0x00007f01")
    assert main_thread_where(current) == "threading.py:320 in wait"


def test_a_follower_far_behind_skips_ahead_to_a_line_start() -> None:
    data = b"".join(f"line {i:08d}\n".encode() for i in range(200_000))
    far = WorkerOutput.follow(io.BytesIO(data), len(data), 0)
    assert far["skipped"] > FOLLOW_BEHIND_BYTES and far["offset"] == len(data)
    assert all(line.startswith("line ") and len(line) == 13 for line in far["lines"])
    since = len(data) - 2 * FOLLOW_BYTES
    near = WorkerOutput.follow(io.BytesIO(data), len(data), since)
    assert near["skipped"] == 0 and FOLLOW_BYTES - 14 < near["offset"] - since <= FOLLOW_BYTES  # whole lines only
    partial = WorkerOutput.follow(io.BytesIO(data + b"half a li"), len(data) + 9, len(data))
    assert partial == {"lines": [], "offset": len(data), "skipped": 0}  # a line still being written waits


def test_a_failure_record_survives_bad_fields() -> None:
    failure = Failure.from_body("b", {"rank": "x", "round": True, "error": {"type": 7}, "exit_code": 1,
                                      "reason": "r" * 5000, "hang": "yes"})
    assert (failure.rank, failure.round, failure.error, failure.hang) == (None, 0, None, False)
    assert len(failure.reason) == 1000
    assert json.loads(json.dumps(failure.body()))["exit_code"] == 1
