"""Many small tensors between two gloo processes: one message each, or bundled (copied into one buffer and out).

Why a heal bundles pieces under 1 MB (trainer_shim.heal_moves.SMALL_BYTES): per message, gloo's framing and
Python's call cost more than copying the bytes twice. Rank 0 sends `--tensors` tensors of `--kb` KB each to rank 1,
both ways alternating, `--repeat` times each; per way the median wall time and each process's CPU (all threads).
The bundled way is what a heal does: the sender concatenates into one buffer, the receiver copies out of it
(trainer_shim.heal_moves.copy_all, one foreach copy).
Usage: bundles.py [--tensors 1332] [--kb 50] [--repeat 7] [--out bench/results/bundles.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
WAYS = ("one message each", "bundled")


def peer(rank: int, port: int, tensors: int, floats: int, repeat: int, out: dict) -> None:
    sys.path.insert(0, str(ROOT))
    from trainer_shim.heal_moves import copy_all

    torch.set_num_threads(1)  # as a worker runs
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    parts = [torch.empty(floats).fill_(rank) for _ in range(tensors)]
    buf = torch.empty(tensors * floats)
    found: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    for _ in range(repeat):
        for way in WAYS:
            dist.barrier()
            wall, cpu = time.perf_counter(), time.process_time()
            if way == WAYS[0]:
                op = dist.isend if rank == 0 else dist.irecv
                for work in [op(p, 1 - rank, tag=i) for i, p in enumerate(parts)]:
                    work.wait()
            elif rank == 0:
                dist.send(torch.cat(parts, out=buf), 1)
            else:
                dist.recv(buf, 0)
                copy_all(parts, list(buf.split(floats)))
            dist.barrier()
            found[way].append((time.perf_counter() - wall, time.process_time() - cpu))
    out[rank] = {way: {"wall_s": statistics.median(w for w, _ in rows), "cpu_s": statistics.median(c for _, c in rows)}
                 for way, rows in found.items()}
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--tensors", type=int, default=1332)
    parser.add_argument("--kb", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "bundles.json"))
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(peer, args=(store.port, args.tensors, args.kb * 256, args.repeat, out), nprocs=2,
                           start_method="spawn")
        ranks = dict(out)
    rows = [{"way": way, "tensors": args.tensors, "kb": args.kb, "wall_ms": round(1e3 * ranks[1][way]["wall_s"], 1),
             "sender_cpu_ms": round(1e3 * ranks[0][way]["cpu_s"], 1),
             "receiver_cpu_ms": round(1e3 * ranks[1][way]["cpu_s"], 1)} for way in WAYS]
    for row in rows:
        print(json.dumps(row))
    Path(args.out).write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                      "torch": torch.__version__, "load": os.getloadavg()[0]},
                                          "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
