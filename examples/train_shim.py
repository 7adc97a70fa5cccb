"""A shim-enabled DDP script: elastic sampler, checksummed checkpoints, daemon checkpoint/drain requests.

Runs under `elasticd start`, plain torchrun, or as one process with no environment at all.
Usage: train_shim.py --steps N --ckpt-dir DIR [--ckpt-every K] [--step-time S] [--batch B]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from typing import TextIO

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

# Run from a checkout without installing: the repository root holds trainer_shim and elasticd.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trainer_shim
from trainer_shim.checkpoint import Checkpointer, load_latest
from trainer_shim.data import ElasticSampler, GlobalBatch

DATASET = 1000  # synthetic samples; an epoch is DATASET / batch steps


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ckpt-dir", default="checkpoints")
    parser.add_argument("--ckpt-every", type=int, default=50, help="periodic save every K steps (0: off)")
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--step-time", type=float, default=0.0, help="extra sleep per step (seconds)")
    parser.add_argument("--batch", type=int, default=48, help="global batch over all ranks")
    parser.add_argument("--micro", type=int, default=8, help="largest micro-batch per rank")
    parser.add_argument("--log-every", type=int, default=1, help="rank 0 prints every N steps")
    parser.add_argument("--async-ckpt", action="store_true", help="periodic saves on a background thread")
    parser.add_argument("--sample-log", default="", help="folder: each rank appends `step epoch ids` per step")
    return parser.parse_args()


def setup() -> torch.device:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend)
    else:  # a bare `python train_shim.py`: a one-process group keeps the DDP code path identical
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        backend = "gloo"
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def synthetic_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)  # identical on every rank and every restart
    x = torch.randn(DATASET, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(DATASET, 1, generator=g)
    return x, y


def open_sample_log(folder: str, rank: int) -> TextIO | None:
    """Which samples each step trained on, per rank and round: tests check no sample repeats or goes missing."""
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    name = f"rank{rank}-round{os.environ.get('ELASTICD_ROUND', '0')}-pid{os.getpid()}.log"
    return open(os.path.join(folder, name), "a")  # open for the whole run


def main() -> int:
    args = parse_args()
    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    session = trainer_shim.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sampler = ElasticSampler(DATASET, rank, world, seed=42)
    gb = GlobalBatch.fit(args.batch, world, args.micro)  # fails fast with a clear message on a bad world
    x_all, y_all = synthetic_data()

    step = 0
    loaded = load_latest(args.ckpt_dir, session=session, map_location=device)
    if loaded is not None:
        model.load_state_dict(loaded.state["model"])
        opt.load_state_dict(loaded.state["opt"])
        sampler.load_state_dict(loaded.state["sampler"])
        step = loaded.state["step"]
    sampler.set_world(rank, world)  # the saved position is global, so any world size resumes exactly
    ckpt = Checkpointer(args.ckpt_dir, keep=args.keep, session=session, background=args.async_ckpt) \
        if rank == 0 else None
    ddp = DDP(model)
    sample_log = open_sample_log(args.sample_log, rank)
    if rank == 0:
        print(f"world_size={world} round={os.environ.get('ELASTICD_ROUND', '-')} start_step={step} "
              f"epoch={sampler.epoch} consumed={sampler.consumed} micro={gb.micro_batch} "
              f"accum={gb.accum_steps}", flush=True)

    def state() -> dict:
        return {"model": model.state_dict(), "opt": opt.state_dict(), "sampler": sampler.state_dict(),
                "step": step}

    while step < args.steps:
        opt.zero_grad(set_to_none=True)
        total, taken = torch.zeros((), device=device), 0
        trained: list[str] = []  # "epoch:ids" per micro-batch, for --sample-log
        for micro in range(gb.accum_steps):
            if sampler.exhausted:
                sampler.set_epoch(sampler.epoch + 1)
            ids = sampler.next_batch(gb.micro_batch)
            trained.append(f"{sampler.epoch}:{','.join(map(str, ids))}")
            idx = torch.tensor(ids, dtype=torch.long)
            x, y = x_all[idx].to(device), y_all[idx].to(device)
            # Sum over this rank's samples, scaled so DDP's mean over ranks yields the global mean.
            with ddp.no_sync() if micro < gb.accum_steps - 1 else contextlib.nullcontext():
                loss = (ddp(x) - y).pow(2).sum() * world / args.batch
                loss.backward()
            total += loss.detach()
            taken += len(idx)  # this rank's samples; the daemon sums ranks
        opt.step()
        step += 1
        if sample_log is not None:
            sample_log.write(f"{step} {' '.join(trained)}\n")
            sample_log.flush()
        loss_value = total.item()  # this rank's estimate of the mean loss; a float keeps report() cheap
        session.report(step, loss=loss_value, samples=taken, epoch=float(sampler.epoch))
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            print(f"step={step} world_size={world} loss={loss_value:.4f}", flush=True)

        if session.should_stop(step):  # drain: save, report, drained, exit 0 at the agreed step
            rid = session.last_request_id
            if ckpt is not None:
                ckpt.save(state(), step, request_id=rid)
                res = ckpt.wait()  # a background save too must be on disk before `drained`
                print(f"drained at step={step} checkpoint={res.path if res else '-'}", flush=True)
            dist.barrier()  # nobody reports drained before the checkpoint is durable
            session.drained(step, rid)
            break
        requested = session.should_checkpoint(step)
        periodic = args.ckpt_every > 0 and step % args.ckpt_every == 0
        if ckpt is not None and (requested or periodic):
            ckpt.save(state(), step, request_id=session.last_request_id if requested else None)
        if args.step_time > 0:
            time.sleep(args.step_time)

    if ckpt is not None:
        ckpt.wait()
    session.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
