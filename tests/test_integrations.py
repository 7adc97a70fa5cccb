"""Lightning and Hugging Face jobs with ElasticCallback under real daemons: metrics, forced checkpoints, drains."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest
from harness import ROOT, Job
from test_shim_e2e import cli, sample_lines, wait_for

from trainer_shim.integrations._common import ElasticCore

# framework -> (the module its example needs, the example, what the zygote pre-imports for every worker)
FRAMEWORKS = {
    "lightning": ("lightning", ROOT / "examples" / "train_lightning.py", "lightning.pytorch"),
    "transformers": ("transformers", ROOT / "examples" / "train_transformers.py", "transformers.trainer"),
}


def need(module: str) -> None:
    """Skip when a framework is missing, except in CI, where it is a dev dependency and must be there."""
    if importlib.util.find_spec(module) is None:
        message = f"{module} is not installed (pip install -e '.[dev]')"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


class Recorder:
    """A stand-in session: what the core reported, and the requests it will find due."""

    enabled = True

    def __init__(self, due: dict[str, int]) -> None:
        self.due, self.last_request_id = due, None
        self.reports: list[tuple[int, float | None, int]] = []

    def report(self, step: int, loss: float | None = None, samples: int = 0) -> None:
        self.reports.append((step, loss, samples))

    def _take(self, op: str, step: int) -> bool:
        if self.due.get(op) == step:
            self.last_request_id = f"{op}-1"
            return True
        return False

    def should_stop(self, step: int) -> bool:
        return self._take("drain", step)

    def should_checkpoint(self, step: int) -> bool:
        return self._take("checkpoint", step)


def test_the_core_reports_optimizer_steps_and_takes_requests_only_there() -> None:
    session = Recorder({"checkpoint": 5, "drain": 6})
    core = ElasticCore(session)  # type: ignore[arg-type]  # a duck-typed stand-in
    core.begin(4)
    assert core.on_batch(4, 8, lambda: 1.0) is None  # a micro-batch of step 5: no boundary yet
    due = core.on_batch(5, 8, lambda: 2.0)
    assert due is not None and (due.op, due.step, due.request_id) == ("checkpoint", 5, "checkpoint-1")
    assert session.reports == [(5, 2.0, 16)]  # the step's micro-batches add up
    core.due = None
    assert core.on_batch(6, 8, lambda: 3.0) is core.drain and core.drain is not None and core.drain.op == "drain"


def test_outside_elasticd_the_core_is_a_quiet_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ELASTICD_WORKER_ADDR", raising=False)
    core = ElasticCore()
    core.begin(0)
    assert not core.enabled and core.on_batch(1, 8, lambda: 1.0) is None
    core.end()


@pytest.mark.parametrize("blocked", [("transformers",), ("lightning", "lightning.pytorch", "pytorch_lightning")])
def test_a_missing_framework_is_named_in_the_import_error(blocked: tuple[str, ...],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules makes `import name` fail
    module = f"trainer_shim.integrations.{blocked[0]}"
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=rf"pip install 'elastic\[{blocked[0]}\]'"):
        importlib.import_module(module)


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_framework_job_reports_checkpoints_and_drains_without_losing_a_step(framework: str, tmp_path: Path) -> None:
    module, example, preload = FRAMEWORKS[framework]
    need(module)
    steps = tmp_path / "steps"
    job = Job(tmp_path, nnodes="1:2", nproc=1, extra=["--preload", preload])
    args = ("--steps", "100000", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "0", "--step-time", "0.05",
            "--step-log", str(steps))
    try:
        job.start("a", example, *args)
        job.start("b", example, *args)
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 2, timeout=120)
        job.wait_event("first_step", since=grown["seq"], timeout=120)

        # Step and loss for both ranks reach `elasticd metrics`.
        def reporting() -> bool:
            ranks = cli(job, "metrics")["ranks"]
            return sorted(r["rank"] for r in ranks if r["step"] and isinstance(r["loss"], float)) == [0, 1]
        wait_for(reporting)

        # `elasticd checkpoint`: the framework saves at the agreed step and the save is reported.
        mark = job.seq()
        reply = cli(job, "checkpoint")
        agreed = job.wait_event("step_agreed", lambda e: e["op_id"] == reply["op_id"], since=mark)
        saved = job.wait_event("checkpoint_saved", lambda e: e["request_id"] == reply["op_id"], since=mark)
        assert saved["step"] == agreed["at_step"] and saved["bytes"] > 0 and os.path.exists(saved["path"])

        # drain b: both ranks stop at one step with a checkpoint; a alone resumes right after it.
        mark = job.seq()
        cli(job, "drain", "b")
        shrunk = job.wait_event("round_started", lambda e: e["world_size"] == 1, since=mark, timeout=90)
        assert not job.wait_event("drain_complete", since=mark)["timed_out"]
        job.wait_event("first_step", since=shrunk["seq"], timeout=120)
        wait_for(lambda: any(f"round{shrunk['round']}-" in p.name and p.read_text() for p in steps.iterdir()))
        trained = [step for step, _ in sample_lines(steps)[0]]
        assert trained == list(range(1, len(trained) + 1)), f"a step was lost or repeated: {trained}"
        assert job.status()["restarts"]["failure"] == 0
    finally:
        job.close()
