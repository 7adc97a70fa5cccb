"""What node health checks cost an idle daemon: its CPU (and its reaped children's: the check command) per second.

One node, one idle worker (bench/toy_job.py, a step a second, printing nothing), measured over --window seconds
once its worker steps, for each setting, interleaved per repetition:
  off          --health-interval 86400: one check at start, then none (the baseline)
  default      --health-interval 30: the log folder (and NVML's counters, where a GPU is)
  command-30s  --health-check true, every 30 s (the site's own check, as most would run it)
  command-1s   --health-check true, every second (the worst case: what one check costs, times 30)
The figure is CPU seconds per wall second of the daemon process, including its reaped children (the check's `sh`),
so a share of one core. The worker and the zygote are not the daemon and are not counted.
Usage: health_overhead.py [--repeat 2] [--window 60] [--out bench/results/health_overhead.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from procs import PY, ROOT, TOY, Launched, on_signal, stop_tree, write_report

SETTINGS = {"off": ["--health-interval", "86400"], "default": [], "command-30s": ["--health-check", "true"],
            "command-1s": ["--health-check", "true", "--health-interval", "1"]}
SUMMARY = re.compile(r"BENCH_SUMMARY")


class Daemon(Launched):
    def __init__(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.stepping = False
        super().__init__(cmd, env, log)

    def on_line(self, now: float, line: str) -> None:
        self.stepping = self.stepping or bool(SUMMARY.search(line))


def cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def measure(name: str, args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-health-{name}-"))
    job = f"bench-health-{name}-{os.getpid()}"
    cmd = [PY, "-m", "elasticd.cli", "start", "--standalone", "--nproc-per-node", "1", "--rdzv-id", job,
           "--log-dir", str(tmp / "logs"), "--preload", "json", *SETTINGS[name],
           str(TOY), "--ckpt", str(tmp / "ck.pt"), "--step-time", "1", "--no-print", "--summary-every", "1"]
    env = dict(os.environ, ELASTICD_RUNTIME_DIR=str(tmp / "rt"), PYTHONUNBUFFERED="1")
    daemon = Daemon(cmd, env, logdir / f"{job}.log")
    try:
        deadline = time.time() + 120
        while not daemon.stepping:
            assert time.time() < deadline and daemon.proc.poll() is None, "the idle job never stepped"
            time.sleep(0.2)
        time.sleep(2.0)  # past start-up's own checks
        proc = psutil.Process(daemon.proc.pid)
        c0, t0, load0 = cpu(proc), time.time(), os.getloadavg()[0]
        time.sleep(args.window)
        c1, t1 = cpu(proc), time.time()
        return {"setting": name, "cpu_pct": round(100 * (c1 - c0) / (t1 - t0), 3), "window_s": round(t1 - t0, 1),
                "load_start": load0, "load_end": os.getloadavg()[0]}
    finally:
        stop_tree(daemon.proc, 10)
        daemon.close()
        shutil.rmtree(tmp, ignore_errors=True)


def markdown(result: dict[str, Any]) -> str:
    lines = [f"## Health checks on an idle daemon ({result['platform']}, {result['cpu_count']} cores; "
             f"{result['args']['repeat']} windows of {result['args']['window']} s each, medians)", "",
             "| setting | daemon CPU (% of a core) | over `off` | load during |", "|---|---|---|---|"]
    base = result["summary"]["off"]["cpu_pct"]
    for name, cell in result["summary"].items():
        lines.append(f"| {name} | {cell['cpu_pct']:.3f} | {cell['cpu_pct'] - base:+.3f} | "
                     f"{cell['load_min']:.1f} to {cell['load_max']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "health_overhead.json"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    out = Path(args.out)
    logdir = out.parent / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    runs = [measure(name, args, logdir) for _ in range(args.repeat) for name in SETTINGS]
    summary = {name: {"cpu_pct": statistics.median(r["cpu_pct"] for r in runs if r["setting"] == name),
                      "load_min": min(min(r["load_start"], r["load_end"]) for r in runs if r["setting"] == name),
                      "load_max": max(max(r["load_start"], r["load_end"]) for r in runs if r["setting"] == name)}
               for name in SETTINGS}
    result = {"args": vars(args), "platform": platform.platform(), "cpu_count": os.cpu_count(), "runs": runs,
              "summary": summary}
    write_report(out, result, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
