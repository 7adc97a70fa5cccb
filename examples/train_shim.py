"""A shim-enabled DDP script: in-place resizes, elastic sampler, checksummed checkpoints, daemon requests.

Runs under `elasticd start`, plain torchrun, or as one process with no environment at all. Under elasticd its
processes survive joins, drains, scale changes, leaves and a peer's crash (trainer_shim.Elastic).
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
from trainer_shim.generation import state_digest

DATASET = 1000  # synthetic samples; an epoch is DATASET / batch steps


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ckpt-dir", default="checkpoints")
    parser.add_argument("--ckpt-every", type=int, default=50, help="periodic save every K steps (0: off)")
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--step-time", type=float, default=0.0, help="extra sleep per step (seconds)")
    parser.add_argument("--data-delay", type=float, default=0.0,
                        help="seconds each micro-batch takes to load on this node (a slow node: a straggler)")
    parser.add_argument("--batch", type=int, default=48, help="global batch over all ranks")
    parser.add_argument("--micro", type=int, default=8, help="largest micro-batch per rank")
    parser.add_argument("--log-every", type=int, default=1, help="rank 0 prints every N steps")
    parser.add_argument("--async-ckpt", action="store_true", help="periodic saves on a background thread")
    parser.add_argument("--sample-log", default="", help="folder: each rank appends `step epoch ids` per step, "
                        "and a digest of its state per world to digests.log")
    parser.add_argument("--state-mb", type=int, default=0, help="benchmarks: this many MB more state per rank, "
                        "kept and healed like the model's (bench/resize.py --state-mb)")
    parser.add_argument("--hidden", type=int, default=64, help="the model's hidden width (its momentum: a newcomer's "
                        "state to receive into new memory)")
    parser.add_argument("--no-in-place", action="store_true", help="restart on every membership change instead")
    parser.add_argument("--fail-resize", action="store_true", help="tests: the rebuild raises on an in-place resize")
    return parser.parse_args()


def device_and_backend() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))), "nccl"
    return torch.device("cpu"), "gloo"


def synthetic_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)  # identical on every rank and every restart
    x = torch.randn(DATASET, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(DATASET, 1, generator=g)
    return x, y


def open_sample_log(folder: str, rank: int, round_id: int) -> TextIO | None:
    """Which samples each step trained on, per rank and round: tests check no sample repeats or goes missing."""
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    name = f"rank{rank}-round{round_id}-pid{os.getpid()}.log"
    return open(os.path.join(folder, name), "a")  # open until the next world


class World:
    """What depends on the world (rank, size): rebuilt by `on_world` at start and after every in-place resize."""

    ddp: DDP
    gb: GlobalBatch
    rank = 0
    size = 1
    sample_log: TextIO | None = None
    ckpt: Checkpointer | None = None
    worlds = 0  # how many worlds this process has been part of


def main() -> int:
    args = parse_args()
    device, backend = device_and_backend()
    session = trainer_shim.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1)) \
        .to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sampler = ElasticSampler(DATASET, seed=42)  # rank and world size: set by the shim for each world
    x_all, y_all = synthetic_data()
    w = World()

    step = 0
    loaded = load_latest(args.ckpt_dir, session=session, map_location=device)
    if loaded is not None:
        model.load_state_dict(loaded.state["model"])
        opt.load_state_dict(loaded.state["opt"])
        sampler.load_state_dict(loaded.state["sampler"])
        step = loaded.state["step"]

    def on_world(rank: int, size: int) -> None:
        """A new world: re-wrap DDP on its group, re-fit the batch, reopen the per-world logs."""
        w.worlds += 1
        if args.fail_resize and w.worlds > 1:
            raise RuntimeError("--fail-resize: this script refuses to resize in place")
        w.rank, w.size = rank, size
        w.gb = GlobalBatch.fit(args.batch, size, args.micro)  # fails fast with a clear message on a bad world
        w.ddp = DDP(model, init_sync=False)  # the shim already made every rank's state the freshest rank's
        elastic.watch(w.ddp)  # its wait in the gradient allreduce: the coordinator names a straggler
        if w.ckpt is not None:
            w.ckpt.wait()
        w.ckpt = Checkpointer(args.ckpt_dir, keep=args.keep, session=session, background=args.async_ckpt) \
            if rank == 0 else None
        if w.sample_log is not None:
            w.sample_log.close()
        round_id = elastic.round if elastic.round else int(os.environ.get("ELASTICD_ROUND", "0"))
        w.sample_log = open_sample_log(args.sample_log, rank, round_id)
        if args.sample_log:
            with open(os.path.join(args.sample_log, "digests.log"), "a") as fh:  # one short line: an atomic append
                fh.write(f"{round_id} {rank} {elastic.step} {state_digest(get_state())}\n")
        if rank == 0:
            print(f"world_size={size} round={round_id} start_step={elastic.step} epoch={sampler.epoch} "
                  f"consumed={sampler.consumed} micro={w.gb.micro_batch} accum={w.gb.accum_steps} "
                  f"pid={os.getpid()} t={time.time():.4f}", flush=True)

    ballast = torch.full((args.state_mb << 18,), 1.0, device=device)  # float32: 2**18 per MB

    def get_state() -> dict:
        return {"model": model.state_dict(), "opt": opt.state_dict(), **({"ballast": ballast} if args.state_mb else {})}

    def set_state(state: dict) -> None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        if args.state_mb and state["ballast"].data_ptr() != ballast.data_ptr():
            ballast.copy_(state["ballast"])

    elastic = trainer_shim.Elastic(session, state_dict=get_state, load_state_dict=set_state, on_world=on_world,
                                   sampler=sampler, backend=backend, in_place=not args.no_in_place)
    step = elastic.init(step)

    def checkpoint_state() -> dict:
        return {**get_state(), "sampler": sampler.state_dict(), "step": elastic.step}

    def train_step(step: int) -> None:
        opt.zero_grad(set_to_none=True)  # a step lost to a peer's crash leaves nothing behind
        total, taken = torch.zeros((), device=device), 0
        trained: list[str] = []  # "epoch:ids" per micro-batch, for --sample-log
        gb, ddp, world = w.gb, w.ddp, w.size
        for micro in range(gb.accum_steps):
            if sampler.exhausted:
                sampler.set_epoch(sampler.epoch + 1)
            ids = sampler.next_batch(gb.micro_batch)
            if args.data_delay > 0:
                time.sleep(args.data_delay)
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
        if w.sample_log is not None:
            w.sample_log.write(f"{step} {' '.join(trained)}\n")
            w.sample_log.flush()
        loss_value = total.item()  # this rank's estimate of the mean loss; a float keeps report() cheap
        session.report(step, loss=loss_value, samples=taken, epoch=float(sampler.epoch))
        if w.rank == 0 and (step % args.log_every == 0 or step == args.steps):
            print(f"step={step} world_size={world} loss={loss_value:.4f} t={time.time():.4f}", flush=True)

    while elastic.step < args.steps:
        step = elastic.run_step(train_step)  # one step; an in-place resize happens here when one is due
        if session.should_stop(step):  # drain (a plain restart path): save, report, drained, exit 0
            rid = session.last_request_id
            if w.ckpt is not None:
                w.ckpt.save(checkpoint_state(), step, request_id=rid)
                res = w.ckpt.wait()  # a background save too must be on disk before `drained`
                print(f"drained at step={step} checkpoint={res.path if res else '-'}", flush=True)
            dist.barrier()  # nobody reports drained before the checkpoint is durable
            session.drained(step, rid)
            break
        requested = session.should_checkpoint(step)
        periodic = args.ckpt_every > 0 and step % args.ckpt_every == 0
        if w.ckpt is not None and (requested or periodic):
            w.ckpt.save(checkpoint_state(), step, request_id=session.last_request_id if requested else None)
        if args.step_time > 0:
            time.sleep(args.step_time)

    if w.ckpt is not None:
        w.ckpt.wait()
    session.close()
    elastic.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
