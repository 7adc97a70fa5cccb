"""A heal's metadata on one rank against the world size: the gathered offers unpickled, then the plan.

Every rank of a heal unpickles the offers it gathered and plans the whole world's moves (trainer_shim.heal_plan),
so that work grows with the world. Here one process does what each rank does, for a data-parallel join (every
survivor holds the whole state at the freshest step, one newcomer holds its model's tensors) and an HSDP join
(2 shards a replica, a newcomer replica), at 1,332 tensors (444 parameters with AdamW's two moments), over a
range of world sizes. Per tree (--trees, each imported in its own process, alternating): the median over
--repeat of the unpickling and of `settle` as rank 0 (a survivor) runs them, in ms. A tree's heal is read for how
it gathers: where its `_offers` sends alike offers once (this tree), ranks with an alike offer share the one
object, and where its `settle` takes the rank planning (this tree), it is rank 0; before, each its own offer.
Usage: heal_plan.py [--trees .,../base] [--worlds 4,16,64,256] [--repeat 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TENSORS = 444  # parameters; with AdamW's two moments, 1,332 tensors


def measure(tree: str, layout: str, world: int, repeat: int) -> dict[str, float]:
    """In this process, importing `tree`: the median ms of unpickling a world's offers and of planning them."""
    sys.path.insert(0, tree)
    import gc
    import inspect
    import pickle
    import time

    import torch

    import trainer_shim.heal as heal
    from trainer_shim.heal_plan import Offer, block, settle

    shares = "digest" in inspect.getsource(heal._offers)  # this tree sends alike offers once
    mine = {"me": 0} if "me" in inspect.signature(settle).parameters else {}  # rank 0, a survivor, plans
    params = [f"model.layers.{i // 4}.w{i % 4}" for i in range(TENSORS)]
    paths = params + [f"optim.state.{p}.{m}" for p in params for m in ("exp_avg", "exp_avg_sq")]
    rows = {p: 256 + 64 * (i % 5) for i, p in enumerate(paths)}

    def blocks(parts: int, at: int) -> dict[str, object]:
        return {p: block((n, 64), torch.float32, 0, n * at // parts, n * (at + 1) // parts) for p, n in rows.items()}

    if layout == "ddp":  # survivors hold it all at step 10; the last rank is a newcomer with its model only
        whole = blocks(1, 0)
        offers = [Offer(10, True, whole, None)] * (world - 1) + \
            [Offer(0, False, {p: whole[p] for p in params}, None)]
    else:  # HSDP: 2 shards a replica; the last replica is new, holding nothing, wanting its shards
        shard = [blocks(2, 0), blocks(2, 1)]
        offers = [Offer(10, True, shard[r % 2], shard[r % 2]) for r in range(world - 2)] + \
            [Offer(-1, True, {}, shard[r % 2]) for r in range(world - 2, world)]
    payloads = [pickle.dumps(o) for o in offers]
    unpickle, plan = [], []
    gc.disable()  # as in a heal (trainer_shim.collection.held)
    for _ in range(repeat):
        t0 = time.perf_counter()
        alike: dict[bytes, object] = {}
        for payload in payloads if shares else []:  # each alike offer once, as this tree's `_offers` gathers
            if payload not in alike:
                alike[payload] = pickle.loads(payload)
        gathered = [alike[p] for p in payloads] if shares else [pickle.loads(p) for p in payloads]
        t1 = time.perf_counter()
        settle(gathered, **mine)  # type: ignore[arg-type]
        t2 = time.perf_counter()
        unpickle.append((t1 - t0) * 1000)
        plan.append((t2 - t1) * 1000)
    return {"unpickle_ms": round(statistics.median(unpickle), 2), "plan_ms": round(statistics.median(plan), 2),
            "shares_alike_offers": shares}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", default=".")
    parser.add_argument("--worlds", default="4,16,64,256")
    parser.add_argument("--layouts", default="ddp,hsdp")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)  # tree layout world repeat: a child's run
    args = parser.parse_args()
    if args.one:
        tree, layout, world, repeat = args.one
        print(json.dumps(measure(tree, layout, int(world), int(repeat))))
        return
    rows = []
    for layout in args.layouts.split(","):
        for world in [int(w) for w in args.worlds.split(",")]:
            for tree in args.trees.split(","):
                path = str(Path(tree).resolve())
                out = subprocess.run([sys.executable, __file__, "--one", path, layout, str(world), str(args.repeat)],
                                     capture_output=True, text=True, check=True, cwd=ROOT)
                row = {"tree": tree, "layout": layout, "world": world, **json.loads(out.stdout),
                       "load": round(os.getloadavg()[0], 2)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"platform": platform.platform(), "python": platform.python_version(),
                                              "args": vars(args), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
