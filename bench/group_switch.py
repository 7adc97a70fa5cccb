"""One generation's group switch, by c10d's `reconfigure` beside a destroy and re-init, in one run.

--ranks gloo ranks on this host and one job store (as the coordinator's daemon hosts it) go through --gens
generations with trainer_shim.generation's own `join` and `leave`, the world alternating between all ranks and all
but the last (a join, then a leave), and one all-reduce in each. The two ways alternate in blocks of --block
generations (ELASTICD_RECONFIGURE=0 for the re-init), so that load drifts over both alike. Per way: the median over
the ranks' switch (leave + join) and switch + first all-reduce. A torch without `reconfigure` (before 2.14)
measures the re-init only, as does an older tree's shim put first on PYTHONPATH (a side-by-side baseline).
Usage: group_switch.py [--ranks 4] [--gens 40] [--block 5]
[--out bench/results/group_switch.json]
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

from trainer_shim import generation
from trainer_shim.generation import Generation, join, leave

WAYS = ("reinit", "reconfigure")
RECONFIGURE_ENV = "ELASTICD_RECONFIGURE"


def can_reconfigure() -> bool:
    """Whether the shim imported (this tree's, or an older one's on PYTHONPATH, which has no reconfigure) can."""
    return bool(getattr(generation, "can_reconfigure", lambda _: False)("gloo"))


def rank_main(rank: int, args: argparse.Namespace, port: int, out: dict) -> None:
    store = dist.TCPStore("127.0.0.1", port, args.ranks, rank == 0, timeout=timedelta(seconds=60))
    ways = WAYS if can_reconfigure() else WAYS[:1]
    took: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
    opened: set[str] = set()
    for gen in range(1, args.gens + 1):
        way = ways[(gen - 1) // args.block % len(ways)]
        world = args.ranks - (gen % 2)  # the last rank sits every other generation out
        os.environ[RECONFIGURE_ENV] = "1" if way == "reconfigure" else "0"
        began = time.perf_counter()
        leave("gloo", False, opened)
        if rank >= world:
            continue
        opened = join(Generation(gen, rank, world, "", f"bench/switch/g{gen}"), "gloo", store, 30)
        joined = time.perf_counter()
        dist.all_reduce(torch.ones(1024))
        if (gen - 1) % args.block:  # not a block's first switch, which changes the way (a group's first init)
            took[way].append((joined - began, time.perf_counter() - began))
    leave("gloo", False, opened)
    if dist.is_initialized():
        dist.destroy_process_group()
    out[rank] = took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--gens", type=int, default=40)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "group_switch.json"))
    args = parser.parse_args()
    took = spawn_ranks(rank_main, args)
    medians: dict[str, dict[str, float]] = {}
    for way in took[0]:
        switch = [a * 1e3 for r in took.values() for a, _ in r[way]]
        first = [b * 1e3 for r in took.values() for _, b in r[way]]
        medians[way] = {"switch": round(statistics.median(switch), 2),
                        "switch_and_allreduce": round(statistics.median(first), 2), "samples": len(switch)}
        print(f"{way:12s} switch {medians[way]['switch']:7.2f} ms   + first all-reduce "
              f"{medians[way]['switch_and_allreduce']:7.2f} ms   ({len(switch)} samples)")
    result = {"args": vars(args), "torch": torch.__version__, "shim": generation.__file__,
              "platform": platform.platform(), "cpu_count": os.cpu_count(), "loadavg": os.getloadavg(), "ms": medians}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
