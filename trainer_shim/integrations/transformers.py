"""`ElasticCallback` for the Hugging Face Trainer: steps to elasticd, checkpoints and drains through its saves."""

from __future__ import annotations

import os
import warnings
from typing import Any

from elasticd.wire.names import WorkerOp
from trainer_shim.integrations._common import ElasticCore, missing

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
except ImportError as exc:
    raise missing("Hugging Face transformers (transformers>=4.40, accelerate>=0.26)", "transformers", exc) from None


def unresumed(output_dir: str | None) -> str | None:
    """What to tell a script whose training starts at step 0 beside a checkpoint it could resume from."""
    last = get_last_checkpoint(output_dir) if output_dir and os.path.isdir(output_dir) else None
    if last is None:
        return None
    return (f"ElasticCallback: training starts at step 0 although {last} holds a checkpoint, so its steps are "
            "trained again. The callback cannot resume for the script; resume with trainer.train("
            "resume_from_checkpoint=get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None) "
            "(get_last_checkpoint is in transformers.trainer_utils).")


class ElasticCallback(TrainerCallback):
    """Reports step, loss and samples; a checkpoint or drain request makes the Trainer save at that step.

    The loss is the Trainer's own logged one (every `logging_steps`): the callback adds no device sync.
    Resuming stays the script's (`trainer.train(resume_from_checkpoint=...)`): the Trainer settles the weights,
    optimizer, data position and RNG state from it before any callback runs. Under elasticd the callback warns
    when training starts at step 0 beside a checkpoint.
    """

    def __init__(self) -> None:
        self.core = ElasticCore()
        self.loss: float | None = None  # the latest logged loss, reported with each step until the next log

    @property
    def drained(self) -> bool:
        """True once training stopped for a drain: skip post-training work, the daemon stops this worker now."""
        return self.core.drain is not None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self.core.begin(state.global_step)
        if state.global_step == 0 and state.is_world_process_zero and self.core.enabled:
            message = unresumed(args.output_dir)
            if message:
                warnings.warn(message, stacklevel=2)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.loss = float(logs["loss"])

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl:
        samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
        due = self.core.on_batch(state.global_step, samples, lambda: self.loss)
        if due is not None:
            control.should_save = True  # the Trainer saves checkpoint-<step> right after this hook, on every rank
            control.should_training_stop = control.should_training_stop or due.op == WorkerOp.drain
        return control

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        # Every save the Trainer makes resets the console's checkpoint age, not only the requested ones.
        path = os.path.join(args.output_dir or "", f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        self.core.saved(state.global_step, path, writer=state.is_world_process_zero)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self.core.end()
