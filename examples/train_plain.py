"""A plain torchrun-style DDP script: env contract only, gloo, snapshot and resume (seeds/003).

Runs unchanged under torchrun or `elasticd start`. Usage: train_plain.py --steps N --snapshot PATH
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--snapshot", default="snapshot.pt")
    parser.add_argument("--step-time", type=float, default=0.05, help="extra sleep per step (seconds)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    start = 0
    if os.path.exists(args.snapshot):
        snap = torch.load(args.snapshot, map_location=device)
        model.load_state_dict(snap["MODEL_STATE"])
        start = snap["STEPS_RUN"]
        print(f"Resuming training from snapshot at step {start}", flush=True)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    round_id = os.environ.get("ELASTICD_ROUND", "?")
    print(f"world_size={world} rank={rank} round={round_id} start_step={start}", flush=True)
    for step in range(start, args.steps):
        x = torch.randn(8, 16, device=device)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            tmp = args.snapshot + ".tmp"
            torch.save({"MODEL_STATE": model.state_dict(), "STEPS_RUN": step + 1}, tmp)
            os.replace(tmp, args.snapshot)
            print(f"step={step + 1} world_size={world} loss={loss.item():.4f}", flush=True)
        time.sleep(args.step_time)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
