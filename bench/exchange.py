"""A heal's exchange of summaries alone: one all-gather of six int64 per rank over gloo, as `trainer_shim.heal`
makes it, at each world size of --ranks, on this host.

Each round starts from a barrier, as a heal starts from the group's formation, and is timed on every rank; then
--rounds all-gathers back to back. Per world: the median and 90th percentile over every rank's rounds. On a host
with fewer cores than ranks this is what a drain's heal costs before any tensor is looked at (issue 35's 10 ms).
Usage: exchange.py [--ranks 2,3,4] [--rounds 30] [--out bench/results/exchange.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from procs import ROOT, spawn_ranks


def rank_main(rank: int, args: argparse.Namespace, port: int, out: dict[int, Any]) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=args.ranks, timeout=timedelta(seconds=30))
    mine = torch.zeros(6, dtype=torch.int64)
    rows = [torch.empty(6, dtype=torch.int64) for _ in range(args.ranks)]
    after_barrier = []
    for _ in range(args.rounds):
        dist.barrier()
        start = time.perf_counter()
        dist.all_gather(rows, mine)
        after_barrier.append(time.perf_counter() - start)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.rounds):
        dist.all_gather(rows, mine)
    out[rank] = {"after_barrier": after_barrier, "back_to_back": (time.perf_counter() - start) / args.rounds}
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--ranks", default="2,3,4")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "exchange.json"))
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as elasticd's workers run
    rows = []
    for ranks in (int(r) for r in args.ranks.split(",")):
        got = spawn_ranks(rank_main, argparse.Namespace(ranks=ranks, rounds=args.rounds))
        times = sorted(t for r in got.values() for t in r["after_barrier"])
        row = {"ranks": ranks, "median_ms": round(statistics.median(times) * 1e3, 2),
               "p90_ms": round(times[int(0.9 * (len(times) - 1))] * 1e3, 2),
               "back_to_back_ms": round(statistics.median(r["back_to_back"] for r in got.values()) * 1e3, 2),
               "load": round(os.getloadavg()[0], 2)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                               "torch": torch.__version__}, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
