"""A gloo job that fails on demand: a rank raises, or blocks in a function, when its trigger file appears."""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout (tests/support/workers/ is 3 down)

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

parser = argparse.ArgumentParser()
parser.add_argument("--triggers", type=Path, required=True, help="crash-RANK or hang-RANK here: that rank acts once")
parser.add_argument("--interval", type=float, default=0.1)
parser.add_argument("--shim", action="store_true", help="report steps through trainer_shim, not step lines")
parser.add_argument("--noise", type=int, default=0, help="also print this many lines per step")
args = parser.parse_args()


def wait_forever() -> None:
    while True:
        time.sleep(0.5)


def train_step(rank: int, step: int) -> None:
    crash, hang = args.triggers / f"crash-{rank}", args.triggers / f"hang-{rank}"
    if crash.exists():
        crash.unlink()
        raise ValueError(f"bad batch at step {step}")
    if hang.exists():
        hang.unlink()
        wait_forever()
    dist.all_reduce(torch.ones(1))


@record  # torch's own: the exception goes to TORCHELASTIC_ERROR_FILE, as under torchrun
def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    session = None
    if args.shim:
        import trainer_shim

        session = trainer_shim.init()
    for step in range(1, 10**9):
        train_step(rank, step)
        if session is not None:
            session.report(step, loss=1.0 / step)
        else:
            print(f"step {step} loss {1.0 / step:.4f}", flush=True)
        for _ in range(args.noise):
            print("noise " * 10, flush=True)
        time.sleep(args.interval)


main()
