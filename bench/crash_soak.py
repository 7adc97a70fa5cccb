"""Crash soak: many worker SIGKILLs in one in-place job under two local daemons (2 workers each), one at a time.

After each kill it waits for the world of 4 again and prints the stall and the steps lost (bench/resize.py's
measure). A stall over --slow-s is counted, with the `worker_not_left` events of the job (a survivor that never
left its group: where it was blocked) printed at the end. The job runs with --max-restarts and --lemon-failures
high enough that neither ends it or cordons a node.
Usage: crash_soak.py [--script titan] [--crashes 60] [--every 2.0] [--seed 1] [--slow-s 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import resize


class SoakJob(resize.Job):
    """bench/resize.py's job, which neither its restarts' budget nor the lemon detector ends or cordons."""

    def cmd(self, node: str) -> list[str]:
        cmd = super().cmd(node)
        cmd[cmd.index("--max-restarts") + 1] = "100000"
        at = cmd.index("--grace-period") + 2
        return [*cmd[:at], "--lemon-failures", "100000", *cmd[at:]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--script", choices=sorted(resize.SCRIPTS), default="titan")
    parser.add_argument("--crashes", type=int, default=60)
    parser.add_argument("--every", type=float, default=2.0, help="mean seconds between a world and the next kill")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slow-s", type=float, default=3.0)
    args = parser.parse_args()
    job_args = argparse.Namespace(script=args.script, step_time=0.02, state_mb=0, base_tree="", timeout=90.0)
    job = SoakJob("in-place", 0, job_args, Path(tempfile.mkdtemp(prefix="crash-soak-logs-")))
    rng = random.Random(args.seed)
    slow, lost, stalls = 0, 0, []
    try:
        for node, world in (("a", 2), ("b", 4)):
            started = time.time()
            job.launch(node)
            job.new_world(started, world, 90)
        for i in range(args.crashes):
            time.sleep(args.every * (0.5 + rng.random()))
            node = rng.choice(["a", "b"])
            victim = rng.choice(job.worker_pids(node))
            killed = time.time()
            os.kill(victim, signal.SIGKILL)
            world_t, start, _ = job.new_world(killed, 4, 90)
            m = job.measure(world_t, start)
            stalls.append(m["stall_s"])
            slow += m["stall_s"] > args.slow_s
            lost += m["steps_lost"] > 0
            print(f"{i} {node} pid {victim}: stall {m['stall_s']} s, {m['steps_lost']} steps lost", flush=True)
        cp = job.cli("events", "--json", "--kind", "worker_not_left")
        stuck = json.loads(cp.stdout or "{}").get("events", [])
    finally:
        job.stop()
    print(f"{len(stalls)} crashes: median stall {sorted(stalls)[len(stalls) // 2]:.3f} s, {slow} over "
          f"{args.slow_s} s, {lost} with steps lost")
    for e in stuck:
        print(f"worker_not_left: node {e['node']} rank {e['rank']} pid {e['pid']}, blocked at "
              f"{e.get('stack', {}).get('where', '?')}\n{e.get('stack', {}).get('text', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
