"""Lightning and Hugging Face jobs with ElasticCallback under real daemons: metrics, forced checkpoints, drains."""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from support.harness import ROOT, Job, cli, sample_lines, wait_for

from trainer_shim.integrations._common import ElasticCore

# framework -> (the module its example needs, the example, what the zygote pre-imports for every worker, its args)
# The Lightning example is a plain script plus ElasticCallback(): no ModelCheckpoint, no ckpt_path.
FRAMEWORKS = {
    "lightning": ("lightning", ROOT / "examples" / "train_lightning.py", "lightning.pytorch", ()),
    "transformers": ("transformers", ROOT / "examples" / "train_transformers.py", "transformers.trainer",
                     ("--ckpt-every", "0")),
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

    def report_checkpoint(self, step: int, path: str, nbytes: int, duration_s: float,
                          request_id: str | None = None) -> None:
        self.reports.append((step, None, nbytes))

    def drained(self, step: int, request_id: str | None = None) -> None:
        pass

    def close(self) -> None:
        pass


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


def fit_tiny(root: Path, due: dict[str, int], ckpt_path: str | None = None, enabled: bool = True) -> tuple[int, int]:
    """A 6-step Lightning fit in this process with ElasticCallback on a stand-in session: (first step, last step)."""
    import lightning.pytorch as pl

    from trainer_shim.integrations.lightning import ElasticCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net, self.started = torch.nn.Linear(2, 1), -1

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).pow(2).mean()

        def on_train_start(self) -> None:
            self.started = self.trainer.global_step

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    session = Recorder(due)
    session.enabled = enabled
    callback = ElasticCallback()
    callback.core = ElasticCore(session)  # type: ignore[arg-type]  # a duck-typed stand-in
    trainer = pl.Trainer(accelerator="cpu", max_steps=6, default_root_dir=root, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[callback])
    model = Tiny()
    data = torch.utils.data.TensorDataset(torch.randn(32, 2))
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4), ckpt_path=ckpt_path)
    return model.started, trainer.global_step


def test_lightning_resumes_from_its_own_checkpoint_only_under_elasticd_and_when_the_script_names_none(
        tmp_path: Path) -> None:
    need("lightning")
    assert fit_tiny(tmp_path, {"drain": 3}) == (0, 3)  # drained at step 3: last-elastic.ckpt holds it
    shutil.copy(tmp_path / "checkpoints" / "last-elastic.ckpt", tmp_path / "mine.ckpt")
    assert fit_tiny(tmp_path, {"drain": 5}) == (3, 5)  # no ckpt_path: the callback's own checkpoint
    assert fit_tiny(tmp_path, {}, ckpt_path=str(tmp_path / "mine.ckpt")) == (3, 6)  # the script's wins (step 3)
    assert fit_tiny(tmp_path, {}, enabled=False) == (0, 6)  # outside elasticd: plain Lightning, from step 0
    assert fit_tiny(tmp_path, {}) == (5, 6)


def test_hugging_face_warns_when_training_starts_at_step_0_beside_a_checkpoint(tmp_path: Path) -> None:
    need("transformers")
    from trainer_shim.integrations.transformers import ElasticCallback

    callback = ElasticCallback()
    callback.core = ElasticCore(Recorder({}))  # type: ignore[arg-type]  # a duck-typed stand-in
    args, state = SimpleNamespace(output_dir=str(tmp_path)), SimpleNamespace(global_step=0, is_world_process_zero=True)
    (tmp_path / "checkpoint-7").mkdir()
    with pytest.warns(UserWarning, match=r"checkpoint-7 holds a checkpoint.*resume_from_checkpoint="):
        callback.on_train_begin(args, state, None)  # type: ignore[arg-type]
    state.global_step = 7  # the script resumed: nothing to say
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        callback.on_train_begin(args, state, None)  # type: ignore[arg-type]


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
    module, example, preload, own = FRAMEWORKS[framework]
    need(module)
    steps = tmp_path / "steps"
    with Job(tmp_path, nnodes="1:2", nproc=1, extra=["--preload", preload]) as job:
        args = ("--steps", "100000", "--ckpt-dir", str(tmp_path / "ckpt"), "--step-time", "0.05", "--step-log",
                str(steps), *own)
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

        # drain b: both ranks stop at one step with a checkpoint; a alone resumes right after it (Lightning from
        # the callback's own checkpoint: the script passes no ckpt_path).
        mark = job.seq()
        drain = cli(job, "drain", "b")
        drained = job.wait_event("checkpoint_saved", lambda e: e["request_id"] == drain["op_id"], since=mark)
        shrunk = job.wait_event("round_started", lambda e: e["world_size"] == 1, since=mark, timeout=90)
        assert not job.wait_event("drain_complete", since=mark)["timed_out"]
        job.wait_event("first_step", since=shrunk["seq"], timeout=120)

        def resumed() -> list[str]:  # the steps rank 0 trained in the shrunk round
            return [line for p in steps.glob(f"rank0-round{shrunk['round']}-*.log") for line in p.read_text().split()]
        wait_for(lambda: bool(resumed()))
        assert int(resumed()[0]) == drained["step"] + 1  # the step right after the drain's save: none lost
        trained = [step for step, _ in sample_lines(steps)[0]]
        assert trained == list(range(1, len(trained) + 1)), f"a step was lost or repeated: {trained}"
        assert job.status()["restarts"]["failure"] == 0
