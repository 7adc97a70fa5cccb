"""How soon the daemon hears of a forked worker's death: SIGKILL -> the zygote's `exited` message, side by side.

Each system starts a real zygote (elasticd/member/processes/zygote.py, preloading nothing), forks --workers sleeping
workers through it, SIGKILLs one at a time at a random moment and times until `ForkedWorker.wait()` returns: what
a crash's detection (the restart path) and a round's wait for its old workers' exits both pay.
  this   the checkout this file is in
  base   --base-tree DIR (e.g. a `git worktree` of the commit before a change), alternating with `this`
Usage: exit_notice.py [--workers 40] [--repeat 3] [--base-tree DIR] [--out bench/results/exit_notice.json]
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

PROBE = """
import asyncio, json, os, random, signal, sys, tempfile, time
from elasticd.member.processes.spawner import Zygote

async def main(workers):
    zygote = Zygote(sys.executable, "", dict(os.environ))
    await zygote.start()
    await zygote.ready.wait()
    seconds = []
    with tempfile.TemporaryDirectory() as cwd:
        script = os.path.join(cwd, "sleeper.py")
        with open(script, "w") as f:
            f.write("import time; time.sleep(60)")
        for _ in range(workers):
            worker = await zygote.spawn([script], dict(os.environ), cwd)
            await asyncio.sleep(random.uniform(0.05, 0.15))  # a crash comes at any moment of the zygote's loop
            began = time.perf_counter()
            os.kill(worker.pid, signal.SIGKILL)
            await worker.wait()
            seconds.append(time.perf_counter() - began)
    await zygote.close()
    print(json.dumps(seconds))

asyncio.run(main(int(sys.argv[1])))
"""


def probe(tree: Path, workers: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(workers)], env=env, cwd=tree, check=True,
                         capture_output=True, text=True, timeout=600)
    return [float(s) for s in json.loads(out.stdout.strip().splitlines()[-1])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--workers", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--base-tree", default="")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "exit_notice.json"))
    args = parser.parse_args()
    trees = {"this": ROOT, **({"base": Path(args.base_tree).resolve()} if args.base_tree else {})}
    seen: dict[str, list[float]] = {name: [] for name in trees}
    for i in range(args.repeat):
        for name, tree in sorted(trees.items(), key=lambda kv: (kv[0] == "this") == (i % 2 == 0)):
            seen[name] += probe(tree, args.workers)
    summary = {name: {"n": len(s), "median_ms": round(statistics.median(s) * 1e3, 2),
                      "p90_ms": round(sorted(s)[int(len(s) * 0.9)] * 1e3, 2), "max_ms": round(max(s) * 1e3, 2)}
               for name, s in seen.items()}
    report = {"args": vars(args), "platform": platform.platform(), "cpu_count": os.cpu_count(),
              "load": os.getloadavg(), "summary": summary, "seconds": seen}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
