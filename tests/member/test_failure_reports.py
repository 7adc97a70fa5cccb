"""A worker's failure is reported once it has raised (its error file), not once its process is finally gone."""

from __future__ import annotations

from pathlib import Path

from support.harness import WORKERS, Job

LINGER_S = 120  # the worker's exit takes this long after it raised: far past the job's end below


def test_a_crash_is_reported_when_its_error_file_appears_while_its_process_still_exits(tmp_path: Path) -> None:
    """A rank that raised under torch's @record may take seconds to exit (a CUDA teardown; here an atexit sleep).
    Its failure goes at once, with the error it recorded: the job ends on it while that process still exits,
    and a peer blocked in a collective with it is never taken for hung meanwhile."""
    with Job(tmp_path, nnodes="1", nproc=1, max_restarts=0) as job:
        job.start("node-a", WORKERS / "slow_exit.py", str(LINGER_S))
        failed = job.wait_event("worker_failed", timeout=60)  # its exit would come after LINGER_S
        assert failed["root_cause"] is True and failed.get("exit_code") is None  # before its process was gone
        assert failed["error"]["type"] == "ValueError" and failed["error"]["source"] == "error_file"
        assert "raised (its process is exiting): ValueError: bad batch at step 3" in failed["reason"]
        end = job.wait_event("job_end", timeout=60)
        assert end["state"] == "failed" and end["root_cause"]["error"]["type"] == "ValueError"
