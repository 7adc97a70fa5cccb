"""A tiny PyTorch Lightning DDP job whose only elastic line is ElasticCallback(): live steps, zero-loss drains.

Runs under `elasticd start`, plain torchrun, or as one process. CPU and gloo; nothing is downloaded.
Usage: train_lightning.py --steps N --ckpt-dir DIR [--step-time S] [--step-log DIR]
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

import lightning.pytorch as pl

from trainer_shim.integrations.lightning import ElasticCallback

DATASET = 1000  # synthetic samples


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ckpt-dir", default="run", help="the Trainer's default_root_dir (checkpoints/ in it)")
    parser.add_argument("--batch", type=int, default=8, help="per-rank batch")
    parser.add_argument("--step-time", type=float, default=0.0, help="extra sleep per step (seconds)")
    parser.add_argument("--step-log", default="", help="folder: each rank appends every step it trains")
    return parser.parse_args()


class Regression(pl.LightningModule):
    def __init__(self, step_time: float, step_log: str) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.step_time, self.step_log = step_time, step_log

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.step_log:  # which global steps each rank trained, per round: tests check none is lost
            name = f"rank{self.global_rank}-round{os.environ.get('ELASTICD_ROUND', '0')}-pid{os.getpid()}.log"
            with open(os.path.join(self.step_log, name), "a") as log:
                log.write(f"{self.trainer.global_step}\n")
        if self.global_rank == 0:
            print(f"step={self.trainer.global_step} world_size={self.trainer.world_size} "
                  f"loss={float(outputs['loss']):.4f}", flush=True)
        time.sleep(self.step_time)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def synthetic_data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1234)  # identical on every rank and every restart
    x = torch.randn(DATASET, 16, generator=g)
    return torch.utils.data.TensorDataset(x, x @ torch.randn(16, 1, generator=g))


def main() -> int:
    args = parse_args()
    if args.step_log:
        os.makedirs(args.step_log, exist_ok=True)
    # The world changes between rounds: take this round's shape from the launcher's environment.
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    num_nodes = int(os.environ.get("WORLD_SIZE", "1")) // devices
    elastic = ElasticCallback()
    trainer = pl.Trainer(
        accelerator="cpu", devices=devices, num_nodes=num_nodes, strategy="ddp" if num_nodes * devices > 1 else "auto",
        max_steps=args.steps, max_epochs=-1, default_root_dir=args.ckpt_dir, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[elastic])
    loader = torch.utils.data.DataLoader(synthetic_data(), batch_size=args.batch, shuffle=True)
    torch.manual_seed(0)
    # No ckpt_path: under elasticd the callback resumes from its own checkpoint after a drain.
    trainer.fit(Regression(args.step_time, args.step_log), loader)
    if elastic.drained:
        print(f"drained at step={trainer.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
