"""A scale right after a drain: are the drained node's hot spares kept, or forked again cold? Side by side.

One lifetime: a, then b joins (world 4); `elasticd drain b` (world 2; b stays a standby and starts hot spares);
`elasticd scale 2` as soon as the drain's world trained one step, while those spares may still load; world 4
again. Per lifetime: the scale's stall (rank 0's last step in world 2 to its first in world 4, as resize.py) and
how many of b's workers in the new world are its spares kept (2: warm) rather than new forks (0: cold), and
`scale_to_world_s`: the command to world 4's first line (the old world trains meanwhile, waiting costs no stall).
Usage: scale_after_drain.py [--script titan-variant] [--systems in-place,in-place-base] [--base-tree DIR]
                            [--repeat 3] [--out bench/results/scale-after-drain.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from procs import ROOT, require_base_tree
from resize import SCRIPTS, Job


def lifetime(system: str, rep: int, args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    job = Job(system, rep, args, logdir)
    try:
        t = time.time()
        job.launch("a")
        job.new_world(t, 2, args.timeout)
        t = time.time()
        job.launch("b")
        job.new_world(t, 4, args.timeout)
        t = time.time()
        job.cli("drain", "b")
        with job.cond:  # the drain's world has trained: b's spares are starting now
            while not any(r[0] == "step" and r[1] > t and r[3] == 2 for r in job.records):
                job.cond.wait(0.5)
        t = time.time()
        job.cli("scale", "2")
        world_t, start, _ = job.new_world(t, 4, args.timeout)
        started = job.started("b")
        return {"system": system, "rep": rep, **job.measure(world_t, start), "scale_to_world_s": round(world_t - t, 3),
                "b_kept": len(started.get("kept", [])), "b_workers": len(started.get("pids", [])),
                "load": os.getloadavg()[0]}
    finally:
        job.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--script", choices=sorted(SCRIPTS), default="titan-variant")
    parser.add_argument("--systems", default="in-place,in-place-base")
    parser.add_argument("--base-tree", default="")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale-after-drain.json"))
    args = parser.parse_args()
    args.state_mb, args.step_time = 0, 0.02  # what Job reads besides: resize.py's defaults
    systems = args.systems.split(",")
    require_base_tree(parser, systems, args.base_tree)
    logdir = Path(args.out).parent / "logs"  # as resize.py's
    logdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for rep in range(args.repeat):
        for system in systems:
            rows.append(lifetime(system, rep, args, logdir))
            print(json.dumps(rows[-1]), flush=True)
    Path(args.out).write_text(json.dumps({"script": args.script, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
