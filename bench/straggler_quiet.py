"""A balanced job names no straggler: real DDP shim nodes (examples/train_shim.py calls `elastic.watch`) train on.

Usage: python bench/straggler_quiet.py [--nodes a,b,c] [--seconds 300] [--slow c --data-delay 0.1]
Every 5 s it reads each rank's allreduce wait (`metrics`' `wait_s`) and the nodes `status` names; at the end it
prints the `straggler` events of the run. A balanced job (no --slow) should have none; with --slow, that node
alone, and the seconds from the first step to its event.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # bench -> tests, never the reverse
from support.harness import SHIM, Job

LOOK_EVERY_S = 5.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="a,b,c")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--slow", default="", help="this node loads its data slowly")
    parser.add_argument("--data-delay", type=float, default=0.1)
    args = parser.parse_args()
    nodes = args.nodes.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="straggler-quiet-"))
    with Job(tmp, nnodes=f"1:{len(nodes)}", nproc=1) as job:
        script = ("--steps", "10000000", "--ckpt-dir", str(tmp / "ckpt"), "--ckpt-every", "0", "--batch", "12",
                  "--micro", "4", "--log-every", "1000")
        waits: dict[str, list[float]] = {n: [] for n in nodes}
        named_looks = 0
        for node in nodes:
            job.start(node, SHIM, *script, *(["--data-delay", str(args.data_delay)] if node == args.slow else []))
        first = job.wait_event("first_step", lambda e: True, timeout=180)
        began, world = time.monotonic(), job.status()["world_size"]
        while time.monotonic() - began < args.seconds:
            time.sleep(LOOK_EVERY_S)
            with job.client() as client:
                for row in client.call("metrics")["ranks"]:
                    if isinstance(row.get("wait_s"), int | float):
                        waits[row["node"]].append(float(row["wait_s"]))
            named_looks += bool(job.status()["stragglers"])
        with job.client() as client:
            events = client.call("events", kinds=["straggler", "straggler_cleared"], since_seq=first["seq"],
                                 limit=0)["events"]
        status = job.status()
    report = {"nodes": nodes, "world": world, "seconds": args.seconds, "slow": args.slow, "load": os.getloadavg(),
              "rounds": status["round"], "looks_with_a_straggler": named_looks,
              "events": [{k: e.get(k) for k in ("kind", "node", "ts", "cost_s_per_step", "wait_s", "others_wait_s")}
                         for e in events],
              "wait_s_by_node": {n: {"median": round(statistics.median(w), 4), "min": round(min(w), 4),
                                     "max": round(max(w), 4), "looks": len(w)} for n, w in waits.items() if w}}
    if events and events[0]["kind"] == "straggler":
        report["first_named_after_s"] = round(events[0]["ts"] - first["ts"], 1)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
