"""What the sharded step's commit vote (trainer_shim.step_commit) adds to a step: steps with it beside steps without.

--ranks gloo ranks on this host, one job store (as the coordinator's daemon hosts it). A step is one allreduce of
--mb MB (a stand-in for the gradient sync the vote follows), then, in a voted block, the vote. Blocks of --block
steps alternate (bare, voted, bare, ...) so that load drifts over both alike; per kind: the median step over
every block, averaged over the ranks. Usage: step_commit.py [--ranks 4] [--mb 1] [--block 200] [--blocks 6]
[--out bench/results/step_commit.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from procs import ROOT, spawn_ranks

from trainer_shim.step_commit import StepCommit


def rank_main(rank: int, args: argparse.Namespace, port: int, out: dict) -> None:
    store = dist.TCPStore("127.0.0.1", port, args.ranks, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=args.ranks)
    grad = torch.ones(args.mb * (1 << 18))
    vote = StepCommit(store, "bench", rank, args.ranks, timeout_s=60)
    steps: dict[str, list[float]] = {"bare": [], "voted": []}
    step = 0
    for block in range(args.blocks):
        kind = "voted" if block % 2 else "bare"
        for _ in range(args.block):
            step += 1
            began = time.perf_counter()
            dist.all_reduce(grad)
            if kind == "voted":
                vote.before_update(step)
            steps[kind].append(time.perf_counter() - began)
    dist.barrier()
    out[rank] = {k: statistics.median(v) * 1e3 for k, v in steps.items()}
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--mb", type=int, default=1)
    parser.add_argument("--block", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "step_commit.json"))
    args = parser.parse_args()
    out = spawn_ranks(rank_main, args)
    medians = {k: statistics.mean(r[k] for r in out.values()) for k in ("bare", "voted")}
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}",
              "ranks": args.ranks, "mb": args.mb, "median_step_ms": {k: round(v, 3) for k, v in medians.items()},
              "ratio_voted_to_bare": round(medians["voted"] / medians["bare"], 3),
              "added_ms": round(medians["voted"] - medians["bare"], 3)}
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
