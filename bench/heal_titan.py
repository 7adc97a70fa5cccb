"""Heal benchmark at a torchtitan-shaped model's tensor count: this tree's heal beside another checkout's, one run.

Four gloo ranks on one (dp_replicate 2, dp_shard 2) mesh hold examples/train_titan.py's model (4 layers, dim 64)
and AdamW's state: 117 DTensors, ~3 MB per replica. Ranks 0 and 1 (one replica) hold step 10; ranks 2 and 3 are
newcomers holding nothing, so each receives its shard from the rank of the other replica with the same index.
--layers sets the model's depth (36: 981 DTensors, the tensor-count axis with FSDP2's own specs, which its
same-shaped tensors share). --survivors 4 makes every rank a survivor (a drain's or a leave's heal: nothing
moves). Every rank enters the heal together (a barrier before it); per tree: the median over --repeat heals of
the survivor's (rank 0) and rank 3's heal, with its plan and transfer parts. Trees alternate, so load drifts
over both alike.
Usage: heal_titan.py [--trees .,../base] [--rounds 2] [--repeat 7] [--survivors 2] [--layers 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from procs import ROOT, free_port


def rank_main(tree: str, rank: int, port: int, repeat: int, survivors: int, layers: int) -> None:
    """One rank: build the model on the mesh, heal `repeat` times, print its timings as one JSON line."""
    sys.path.insert(0, tree)  # the tree's trainer_shim and examples, ahead of any installed copy
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from examples import train_titan
    from trainer_shim.heal import NOTHING, heal  # both trees' (heal_plan.NOTHING's older home)
    from trainer_shim.state_paths import flatten

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    with torch.device("meta"):
        model = train_titan.Transformer(64, layers, 4)
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    model.init_weights()
    opt = torch.optim.AdamW(model.parameters())
    survivor = rank < survivors
    rows = []
    for _ in range(repeat):
        target: dict[str, torch.Tensor] = {}
        model_state, optim_state = get_state_dict(model, opt)
        skeleton = flatten({"user": {"model": model_state, "optim": optim_state}, "step": 10}, target)
        dist.barrier()
        start = time.perf_counter()
        healed, _ = heal(10 if survivor else NOTHING, target if survivor else {}, skeleton, target,
                         torch.device("cpu"), survivor)
        rows.append((time.perf_counter() - start, healed.plan_s, healed.transfer_s))
    print(json.dumps({"rank": rank, "tensors": len(target), "heal_s": statistics.median(r[0] for r in rows),
                      "plan_s": statistics.median(r[1] for r in rows),
                      "transfer_s": statistics.median(r[2] for r in rows)}), flush=True)
    dist.destroy_process_group()


def one_tree(tree: str, repeat: int, survivors: int, layers: int) -> dict[int, dict[str, float]]:
    port = free_port()
    argv = ["--port", str(port), "--tree", tree, "--repeat", str(repeat), "--survivors", str(survivors),
            "--layers", str(layers)]
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for r in range(4)]
    found = {}
    for p in procs:
        out, _ = p.communicate(timeout=300)
        for line in out.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                found[row.pop("rank")] = row
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--trees", default=str(ROOT), help="checkouts to compare, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the trees, alternating")
    parser.add_argument("--repeat", type=int, default=7, help="heals per pass (the median is kept)")
    parser.add_argument("--survivors", type=int, default=2, help="ranks holding step 10 (4: a drain's heal)")
    parser.add_argument("--layers", type=int, default=4, help="the model's layers (4: 117 DTensors, 36: 981)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "heal_titan.json"))
    parser.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--tree", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank >= 0:
        rank_main(args.tree, args.rank, args.port, args.repeat, args.survivors, args.layers)
        return 0
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    runs = []
    for _ in range(args.rounds):
        for tree in trees:
            ranks = one_tree(tree, args.repeat, args.survivors, args.layers)
            runs.append({"tree": tree, "load": os.getloadavg()[0], "survivor": ranks.get(0), "newcomer": ranks.get(3)})
            print(json.dumps(runs[-1]), flush=True)
    tensors = (runs[0]["survivor"] or {}).get("tensors")
    print(f"## heal at {tensors} tensors, 4 ranks (HSDP 2x2), {platform.platform()}, {os.cpu_count()} cores")
    print("| tree | rank 0 heal (s) | rank 3 heal (s) | rank 3 plan (s) | rank 3 transfer (s) | load |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        s, n = r["survivor"] or {}, r["newcomer"] or {}
        print(f"| {r['tree']} | {s.get('heal_s', 0):.4f} | {n.get('heal_s', 0):.4f} | {n.get('plan_s', 0):.4f} | "
              f"{n.get('transfer_s', 0):.4f} | {r['load']:.2f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"platform": platform.platform(), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
