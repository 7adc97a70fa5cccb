"""`ElasticCallback` for PyTorch Lightning: steps to elasticd, forced checkpoints and drains through Lightning's own."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping
from typing import Any

from elasticd.wire.names import WorkerOp
from trainer_shim.integrations._common import ElasticCore, missing

try:
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.data import extract_batch_size
except ImportError as lightning_missing:  # the older package name carries the same API
    try:
        import pytorch_lightning as pl
        from pytorch_lightning.utilities.data import extract_batch_size
    except ImportError:
        raise missing("PyTorch Lightning (lightning>=2.2)", "lightning", lightning_missing) from None

FILENAME = "last-elastic.ckpt"  # a `last*` name, so `fit(ckpt_path="last")` finds it beside ModelCheckpoint's


def _samples(batch: Any) -> int:
    try:
        return extract_batch_size(batch)
    except Exception:  # a batch with no tensor in it: its samples are not counted, training goes on
        return 0


def _loss(outputs: Any) -> float | None:
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    return float(loss) if loss is not None else None


class ElasticCallback(pl.Callback):
    """Reports step, loss and samples; saves `FILENAME` on `elasticd checkpoint`; saves and stops on a drain.

    Under elasticd, a `fit` given no `ckpt_path` resumes from `FILENAME` when it exists: a drained job picks up
    at the next step with no change to the script. A `ckpt_path` the script passes wins (`"last"` finds this
    file beside ModelCheckpoint's `last.ckpt` when both share a folder).

    `dirpath`: where the elastic checkpoint goes; by default the first ModelCheckpoint's own `dirpath`, or
    `<default_root_dir>/checkpoints`.
    """

    def __init__(self, dirpath: str | None = None) -> None:
        super().__init__()
        self.dirpath = dirpath
        self.core = ElasticCore()
        self._folder: str | None = None  # fixed at the first setup, so every round looks in the same place

    def path(self, trainer: pl.Trainer) -> str:
        return os.path.join(self._folder or self._pick_folder(trainer), FILENAME)

    def _pick_folder(self, trainer: pl.Trainer) -> str:
        return self.dirpath or getattr(trainer.checkpoint_callback, "dirpath", None) \
            or os.path.join(trainer.default_root_dir, "checkpoints")

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Lightning runs checkpoint callbacks' setup last, so a ModelCheckpoint's dirpath is still the script's
        # here: left unset, it becomes the logger's version_N folder, a new one each round, where no resume looks.
        self._folder = self._folder or self._pick_folder(trainer)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # ckpt_path is the script's by now (resolved: "last" found a file or None). FSDP and DeepSpeed load it only
        # after this hook: theirs is then loaded over ours, so the script's choice still wins.
        if trainer.ckpt_path is None and self.core.enabled:
            self._resume(trainer)

    def _resume(self, trainer: pl.Trainer) -> None:
        path = self.path(trainer)
        # Every rank follows rank 0: a rank that restored alone would train another model in lockstep with it.
        if not trainer.strategy.broadcast(os.path.exists(path)):
            return
        # Lightning has no public call that restores a checkpoint into a fit under way (fit(ckpt_path=) is the
        # public one, and the script gave none); the connector's restore() is what fit runs for it: module,
        # callbacks, loops, optimizers and schedulers, then a barrier. Lightning itself restores FSDP and
        # DeepSpeed runs at this same point, after the strategy's setup.
        trainer._checkpoint_connector.restore(path)

    @property
    def drained(self) -> bool:
        """True once training stopped for a drain: skip post-training work, the daemon stops this worker now."""
        return self.core.drain is not None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.core.begin(trainer.global_step)
        if self.core.enabled and threading.current_thread() is threading.main_thread():
            # Under elasticd a preemption reaches the daemon, which drains through this callback; a SIGTERM
            # to the worker means "stop now". Lightning's handler would broadcast from inside the signal
            # handler and stop a step later, waiting on peers that may be gone. Its teardown restores it.
            original = getattr(getattr(trainer, "_signal_connector", None), "_original_handlers", {})
            signal.signal(signal.SIGTERM, original.get(signal.SIGTERM, signal.SIG_DFL))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        due = self.core.on_batch(trainer.global_step, _samples(batch), lambda: _loss(outputs))
        if due is None:
            return
        path = self.path(trainer)
        trainer.save_checkpoint(path)  # every rank: the strategy gathers what it needs, then a barrier
        self.core.saved(due.step, path, writer=trainer.is_global_zero)
        if due.op == WorkerOp.drain:
            trainer.should_stop = True  # Lightning ends the fit; `drained` goes out in on_train_end

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.core.end()
