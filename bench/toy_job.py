"""The toy DDP job the recovery and overhead benchmarks time, under elasticd and under torchrun.

gloo, a small MLP, a checkpoint every step (rank 0, atomic rename), one line per step from rank 0:

    BENCH_START t=<time.time()> pid=<pid> rank=<RANK> local=<LOCAL_RANK>     (every worker, first thing)
    BENCH_RESUME t=... step=<resume step> world=<W> t0=<process start> pid=...   (rank 0, once)
    BENCH_STEP t=<time.time()> step=<N> world=<W> t0=<process start> pid=...      (rank 0, every step)

`t0` (when this process started running the script) lets the harness tell a step of a new world
from a late step of the old one when both have the same size (a crash restarts into world 4 again).

With --shim the job also uses trainer_shim: report() every step and, on should_stop(), a final
save, a barrier and drained() (the zero-loss drain). Without ELASTICD_WORKER_ADDR the shim is a no-op.

Usage: toy_job.py --ckpt PATH [--step-time 0.05] [--steps N] [--shim] [--quiet-steps]
"""

from __future__ import annotations

import time

T0 = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

print(f"BENCH_START t={T0:.6f} pid={os.getpid()} rank={os.environ.get('RANK', '-')} "
      f"local={os.environ.get('LOCAL_RANK', '-')}", flush=True)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint file (rank 0 saves it every step)")
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--step-time", type=float, default=0.05, help="sleep per step (seconds)")
    p.add_argument("--shim", action="store_true", help="report to elasticd through trainer_shim")
    p.add_argument("--no-print", action="store_true", help="no per-step line (overhead runs print a summary)")
    p.add_argument("--summary-every", type=int, default=0, help="print step-time stats every K steps")
    return p.parse_args()


def save(path: str, model: torch.nn.Module, step: int) -> None:
    tmp = f"{path}.tmp"
    torch.save({"model": model.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def main() -> int:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    # Rank 0 decides the resume step and DDP broadcasts its weights: every rank starts identical even
    # if an old rank 0 was still writing when another node's new workers started.
    start = torch.zeros(1, dtype=torch.long)
    if rank == 0 and os.path.exists(args.ckpt):
        snap = torch.load(args.ckpt, map_location="cpu")
        model.load_state_dict(snap["model"])
        start[0] = int(snap["step"])
    dist.broadcast(start, 0)
    step = int(start[0])
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    session = None
    if args.shim:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import trainer_shim

        session = trainer_shim.init()
    if rank == 0:
        print(f"BENCH_RESUME t={time.time():.6f} step={step} world={world} t0={T0:.6f} pid={os.getpid()}",
              flush=True)
    times: list[float] = []
    last = time.perf_counter()
    while step < args.steps:
        x = torch.randn(16, 32)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if rank == 0:
            save(args.ckpt, model, step)
            if not args.no_print:
                print(f"BENCH_STEP t={time.time():.6f} step={step} world={world} t0={T0:.6f} pid={os.getpid()}",
                      flush=True)
        if session is not None:
            session.report(step, loss=float(loss.item()))
            if session.should_stop(step):  # drain: the checkpoint of this step is on disk (rank 0 saved it)
                dist.barrier()
                session.drained(step, session.last_request_id)
                if rank == 0:
                    print(f"BENCH_DRAINED t={time.time():.6f} step={step} world={world}", flush=True)
                break
        if args.step_time > 0:
            time.sleep(args.step_time)
        now = time.perf_counter()
        times.append(now - last)
        last = now
        if args.summary_every and rank == 0 and len(times) % args.summary_every == 0:
            window = sorted(times[-args.summary_every:])
            print(f"BENCH_SUMMARY t={time.time():.6f} steps={len(times)} world={world} "
                  f"median={window[len(window) // 2]:.6f} mean={sum(window) / len(window):.6f}", flush=True)
    t_close = time.time()
    if session is not None:
        session.close()
    t_destroy = time.time()
    dist.destroy_process_group()
    print(f"BENCH_EXIT t={time.time():.6f} rank={rank} close={t_destroy - t_close:.3f} "
          f"destroy={time.time() - t_destroy:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
