"""A tiny Hugging Face Trainer job (a 1-layer GPT-2 built from its config) with ElasticCallback.

Runs under `elasticd start`, plain torchrun, or as one process. CPU and gloo; nothing is downloaded.
Usage: train_transformers.py --steps N --ckpt-dir DIR [--step-time S] [--step-log DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch

# Run from a checkout without installing: the repository root holds trainer_shim and elasticd.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from trainer_shim.integrations.transformers import ElasticCallback

DATASET, VOCAB, LENGTH = 1000, 64, 16  # synthetic token sequences


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ckpt-dir", default="checkpoints", help="the Trainer's output_dir")
    parser.add_argument("--ckpt-every", type=int, default=50, help="the Trainer's own save every K steps (0: off)")
    parser.add_argument("--batch", type=int, default=8, help="per-rank batch")
    parser.add_argument("--step-time", type=float, default=0.0, help="extra sleep per step (seconds)")
    parser.add_argument("--step-log", default="", help="folder: each rank appends every step it trains")
    return parser.parse_args()


class Tokens(torch.utils.data.Dataset):
    """Sequences that count up from a random start: a pattern one layer learns within a few hundred steps."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1234)  # identical on every rank and every restart
        starts = torch.randint(0, VOCAB, (DATASET, 1), generator=g)
        self.ids = (starts + torch.arange(LENGTH)) % VOCAB

    def __len__(self) -> int:
        return DATASET

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class StepLog(TrainerCallback):
    """Prints rank 0's steps; with --step-log, which global steps each rank trained, per round."""

    def __init__(self, folder: str, step_time: float) -> None:
        self.folder, self.step_time = folder, step_time

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if self.folder:
            name = f"rank{args.process_index}-round{os.environ.get('ELASTICD_ROUND', '0')}-pid{os.getpid()}.log"
            with open(os.path.join(self.folder, name), "a") as log:
                log.write(f"{state.global_step}\n")
        if state.is_world_process_zero:
            print(f"step={state.global_step} world_size={args.world_size}", flush=True)
        time.sleep(self.step_time)


def main() -> int:
    args = parse_args()
    if args.step_log:
        os.makedirs(args.step_log, exist_ok=True)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=1, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    training = TrainingArguments(
        output_dir=args.ckpt_dir, max_steps=args.steps, per_device_train_batch_size=args.batch, learning_rate=1e-3,
        logging_steps=1, save_strategy="steps" if args.ckpt_every else "no", save_steps=args.ckpt_every or 500,
        save_total_limit=2, report_to="none", use_cpu=True, ddp_find_unused_parameters=False,
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None, disable_tqdm=True, seed=0)
    elastic = ElasticCallback()
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(),
                      callbacks=[elastic, StepLog(args.step_log, args.step_time)])
    # The Trainer's own resume: the newest checkpoint-<step> in output_dir, if there is one yet.
    trainer.train(resume_from_checkpoint=get_last_checkpoint(args.ckpt_dir) if os.path.isdir(args.ckpt_dir) else None)
    if elastic.drained:
        print(f"drained at step={trainer.state.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
