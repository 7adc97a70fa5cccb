"""Why a local worker failed: torch's error file when the script wrote one (`@record`), else its last traceback."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Mapping, Sequence

from elasticd.member.processes.workers import Worker
from elasticd.wire.diagnosis import ERROR_FILE, OUTPUT, ErrorInfo, Failure
from elasticd.wire.protocol import Json

MAX_ERROR_FILE_BYTES = 1024 * 1024


def read_error_file(worker: Worker) -> ErrorInfo | None:
    """torch.distributed.elastic's error file, as its `@record` writes it: {"message": {"message": "T: m",
    "extraInfo": {"py_callstack": "Traceback…"}}}; an older plain `message` string too. None if absent or unreadable."""
    try:
        with open(worker.error_file, "rb") as handle:
            data: Json = json.loads(handle.read(MAX_ERROR_FILE_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str):
        return ErrorInfo.from_traceback("", ERROR_FILE, headline=message.strip().splitlines()[0] if message else "")
    if not isinstance(message, dict):
        return None
    extra = message.get("extraInfo")
    stack = str(extra.get("py_callstack", "")) if isinstance(extra, dict) else ""
    headline = str(message.get("message", "")).strip()
    return ErrorInfo.from_traceback(stack, ERROR_FILE, headline=headline.splitlines()[0] if headline else "")


def error_of(worker: Worker) -> ErrorInfo | None:
    """The error file first (it is what the script itself recorded), else the last traceback in its output."""
    recorded = read_error_file(worker)
    if recorded is not None:
        return recorded
    if worker.output.traceback:
        return ErrorInfo.from_traceback("\n".join(worker.output.traceback), OUTPUT)
    return None


def failure_of(worker: Worker, node: str, round_id: int) -> Failure:
    """Its failure at its exit, or before it (`exit_code` None): once its error file says what it raised."""
    code = worker.exit_code
    error = error_of(worker)
    reason = f"worker rank {worker.rank} on node {node} " + \
        (f"exited with {describe_exit(code)}" if code is not None else "raised (its process is exiting)")
    if error is not None:
        reason += f": {error.summary}"
    return Failure(node, worker.rank, round_id, code, signal_name(code), worker.proc.pid,
                   worker.exited_at or time.time(), error,
                   reason=reason, log=str(worker.log_path),
                   error_file=str(worker.error_file) if error and error.source == ERROR_FILE else "")


def signal_name(code: int | None) -> str:
    if code is None or code >= 0:
        return ""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return str(-code)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit code"
    return f"signal {signal_name(code)}" if code < 0 else f"exit code {code}"


def failure_summary(entry: str, cause: Mapping[str, Json] | None, consequences: Sequence[Mapping[str, Json]]) -> str:
    """torchrun's closing table for a job that failed for good: the root cause, then the failures that followed."""
    if cause is None:
        return ""
    rule = "=" * 60
    root = Failure.from_body(str(cause.get("node", "?")), cause)
    others = [Failure.from_body(str(c.get("node", "?")), c) for c in consequences]
    lines = [rule, f"{entry} FAILED", "-" * 60, "Failures:"]
    for i, other in enumerate(others, 1):
        lines += [f"[{i}]:", *_rows(other)]
    if not others:
        lines.append("  <NO_OTHER_FAILURES>")
    lines += ["-" * 60, "Root Cause (first observed failure):", "[0]:", *_rows(root), rule]
    return "\n".join(lines)


def _rows(failure: Failure) -> list[str]:
    when = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(failure.at)) if failure.at else "-"
    error = failure.error
    rows = [f"  time      : {when}", f"  node      : {failure.node}",
            f"  rank      : {failure.rank if failure.rank is not None else '-'}",
            f"  exitcode  : {failure.exit_code if failure.exit_code is not None else '-'} (pid: {failure.pid or '-'})"]
    if failure.error_file:
        rows.append(f"  error_file: {failure.error_file}")
    if error is not None:
        rows.append(f"  error     : {error.summary}")
        rows += ["  traceback :", *(f"    {line}" for line in error.traceback.splitlines())]
    else:
        rows.append(f"  error     : {failure.reason or '<N/A>'}")
    return rows
