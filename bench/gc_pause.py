"""A full garbage collection in titan-shaped workers, with and without the shim's freeze of what a worker imported.

Each of --ranks processes joins one gloo group, builds examples/train_titan.py's model (FSDP2 per layer on the named
HSDP mesh, AdamW, one step), then times:
  objects    what the collector tracks after the build
  full_ms    `gc.collect()` (what Python's own full pass costs, and where a resize lands it, every rank waits)
  rebuilt_ms `gc.collect()` after a second build dropped the first model (FSDP2's cycles: freed only by it)
  freed      whether that collection freed the first model (a weak reference to one of its parameters)
for `plain` (no freeze) and `frozen` (trainer_shim.collection.freeze_imports() before the first build, as
Elastic.init does under elasticd), alternating, in one run.
Usage: gc_pause.py [--ranks 4] [--repeat 2] [--layers 4] [--out bench/results/gc_pause.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import weakref
from datetime import timedelta
from pathlib import Path
from typing import Any

from procs import ROOT, spawn_ranks


def rank_main(rank: int, args: argparse.Namespace, port: int, out: dict) -> None:
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from examples import train_titan
    from trainer_shim.collection import freeze_imports

    store = dist.TCPStore("127.0.0.1", port, world_size=args.ranks, is_master=rank == 0,
                          timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=args.ranks)
    if args.mode == "frozen":
        freeze_imports()

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        mesh = init_device_mesh("cpu", (args.ranks // 2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
        with torch.device("meta"):
            model = train_titan.Transformer(64, args.layers, 4)
        for layer in model.layers.values():
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device="cpu")
        model.init_weights()  # type: ignore[operator]
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randint(0, train_titan.VOCAB, (2, train_titan.SEQ))).sum().backward()
        opt.step()
        return model, opt

    def timed_collect() -> float:
        dist.barrier()  # every rank at once, as in a resize
        began = time.perf_counter()
        gc.collect()
        return (time.perf_counter() - began) * 1000

    first = build()
    objects, full_ms = len(gc.get_objects()), timed_collect()
    ref = weakref.ref(next(iter(first[0].parameters())))
    first = build()  # the old world's model dropped, as a survivor's rebuild drops it
    rebuilt_ms = timed_collect()
    out[rank] = {"objects": objects, "full_ms": round(full_ms, 1), "rebuilt_ms": round(rebuilt_ms, 1),
                 "freed": ref() is None}
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "gc_pause.json"))
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for i in range(args.repeat):
        for mode in ("plain", "frozen"):
            args.mode = mode
            per_rank = spawn_ranks(rank_main, args)
            row = {"mode": mode, "run": i + 1, "load": round(os.getloadavg()[0], 2),
                   **{k: max(r[k] for r in per_rank.values()) for k in ("objects", "full_ms", "rebuilt_ms")},
                   "freed": all(r["freed"] for r in per_rank.values())}
            print(json.dumps(row), flush=True)
            rows.append(row)
    summary = {mode: {k: statistics.median(r[k] for r in rows if r["mode"] == mode)
                      for k in ("objects", "full_ms", "rebuilt_ms")} for mode in ("plain", "frozen")}
    report = {"args": {k: v for k, v in vars(args).items() if k != "mode"}, "platform": platform.platform(),
              "cpu_count": os.cpu_count(), "rows": rows, "median_of_slowest_rank": summary}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print("median (the slowest rank of each run):", json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
