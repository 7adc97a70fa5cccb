"""`ElasticCallback` for PyTorch Lightning: steps to elasticd, forced checkpoints and drains through Lightning's own."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping
from typing import Any

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

    `dirpath`: where the elastic checkpoint goes; by default the first ModelCheckpoint's folder, or
    `<default_root_dir>/checkpoints`. Resume with `trainer.fit(..., ckpt_path="last")`, or pass the file
    `path(trainer)` names.
    """

    def __init__(self, dirpath: str | None = None) -> None:
        super().__init__()
        self.dirpath = dirpath
        self.core = ElasticCore()

    def path(self, trainer: pl.Trainer) -> str:
        folder = self.dirpath or getattr(trainer.checkpoint_callback, "dirpath", None) \
            or os.path.join(trainer.default_root_dir, "checkpoints")
        return os.path.join(folder, FILENAME)

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
        if due.op == "drain":
            trainer.should_stop = True  # Lightning ends the fit; `drained` goes out in on_train_end

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.core.end()
