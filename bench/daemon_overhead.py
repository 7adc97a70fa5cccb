"""Daemon overhead: the toy job's step time under elasticd vs torchrun, and the daemon's own CPU.

1. Step time (world 4: 2 nodes x 2 workers on 127.0.0.1, --nnodes 2 so both start together): median of
   rank 0's step-to-step intervals over --steps steps (the first --warmup skipped), for torchrun
   (c10d), elasticd (plain toy job) and elasticd with trainer_shim (report every step).
2. Daemon CPU (psutil cpu_times user+sys of the daemon process over --window seconds), one node:
   - idle: the daemon with 2 plain workers (no shim: nothing reports, it only relays output);
   - 8 shim workers reporting every step (--nproc-per-node 8, toy job --shim);
   the zygote (elasticd) and torchrun's agent are measured the same way for comparison.

Usage: daemon_overhead.py [--steps 200] [--window 10] [--out bench/results/daemon_overhead.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from procs import PY, ROOT, TOY, Launched, free_port, is_zygote, on_signal, stop_tree

STEP = re.compile(r"BENCH_STEP t=(\S+) step=(\d+) world=(\d+)")
SUMMARY = re.compile(r"BENCH_SUMMARY t=(\S+) steps=(\d+) world=(\d+) median=(\S+)")


class Proc(Launched):
    """One agent/daemon process; its output lines are kept with their arrival times."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.lines: list[tuple[float, str]] = []
        self.cond = threading.Condition()
        super().__init__(cmd, env, log)

    def on_line(self, now: float, line: str) -> None:
        with self.cond:
            self.lines.append((now, line))
            self.cond.notify_all()

    def wait_line(self, pattern: re.Pattern, timeout: float, start: int = 0) -> tuple[int, re.Match]:
        deadline = time.time() + timeout
        i = start
        with self.cond:
            while True:
                while i < len(self.lines):
                    m = pattern.search(self.lines[i][1])
                    if m:
                        return i, m
                    i += 1
                if time.time() > deadline:
                    raise TimeoutError(pattern.pattern)
                self.cond.wait(0.5)

    def stop(self) -> None:
        stop_tree(self.proc, 8)
        with contextlib.suppress(Exception):
            self.proc.wait(5)
        self.close()


def launch(system: str, node: str, nnodes: str, nproc: int, port: int, job: str, tmp: Path, script: list[str],
           logdir: Path) -> Proc:
    env = dict(os.environ, ELASTICD_RUNTIME_DIR=str(tmp / "rt"), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               PYTHONUNBUFFERED="1")
    common = ["--nnodes", nnodes, "--nproc-per-node", str(nproc), "--rdzv-endpoint", f"127.0.0.1:{port}",
              "--rdzv-id", job, "--max-restarts", "0"]
    if system.startswith("elasticd"):
        cmd = [PY, "-m", "elasticd.cli", "start", *common, "--node-id", node, "--log-dir", str(tmp / "logs"),
               str(TOY), *script]
    else:
        cmd = [PY, "-m", "torch.distributed.run", "--rdzv-backend", "c10d", "--rdzv-conf", "last_call_timeout=1",
               *common, str(TOY), *script]
    return Proc(cmd, env, logdir / f"overhead-{job}-{node}.log")


def step_time(system: str, args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-ovh-{system}-"))
    port, job = free_port(), f"bench-ovh-{system}-{os.getpid()}"
    script = ["--ckpt", str(tmp / "ck.pt"), "--step-time", str(args.step_time), "--steps",
              str(args.steps + args.warmup)]
    if system == "elasticd-shim":
        script.append("--shim")
    load0 = os.getloadavg()
    nodes = [launch(system, "a", "2", 2, port, job, tmp, script, logdir)]
    time.sleep(1.0)  # a binds the rendezvous endpoint first
    nodes.append(launch(system, "b", "2", 2, port, job, tmp, script, logdir))
    try:
        # Stop at the last step rather than waiting for the job to end: a gloo worker can deadlock in
        # ProcessGroupGloo's destructor at interpreter exit (seen ~1 run in 10 here), and no step is lost.
        last = re.compile(rf"BENCH_STEP t=\S+ step={args.steps + args.warmup} world=4")
        deadline = time.time() + args.steps * 0.5 + 120
        while time.time() < deadline and not any(last.search(line) for n in nodes for _, line in n.lines[-5:]):
            time.sleep(0.2)
        steps = {}
        for n in nodes:
            for _, line in n.lines:
                m = STEP.search(line)
                if m and int(m.group(3)) == 4:
                    steps[int(m.group(2))] = float(m.group(1))
        seq = sorted(s for s in steps if s > args.warmup)
        dts = [steps[s] - steps[s - 1] for s in seq if s - 1 in steps]
        return {"system": system, "steps": len(dts), "median_step_s": statistics.median(dts) if dts else None,
                "mean_step_s": statistics.fmean(dts) if dts else None,
                "p90_step_s": sorted(dts)[int(0.9 * len(dts))] if dts else None,
                "loadavg_start": load0, "loadavg_end": os.getloadavg()}
    finally:
        for n in nodes:
            n.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def cpu_of(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def daemon_cpu(system: str, nproc: int, shim: bool, args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    """CPU seconds per wall second of the agent/daemon (and elasticd's zygote) over a window."""
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-cpu-{system}-"))
    port, job = free_port(), f"bench-cpu-{system}-{nproc}-{int(shim)}-{os.getpid()}"
    script = ["--ckpt", str(tmp / "ck.pt"), "--step-time", str(args.cpu_step_time), "--no-print",
              "--summary-every", "50"]
    if shim:
        script.append("--shim")
    load0 = os.getloadavg()
    node = launch(system, "a", "1", nproc, port, job, tmp, script, logdir)
    try:
        idx, _ = node.wait_line(SUMMARY, 180)  # the workers are stepping
        root = psutil.Process(node.proc.pid)
        helpers = [p for p in root.children() if is_zygote(p)]
        d0, h0, t0 = cpu_of([root]), cpu_of(helpers), time.time()
        s0 = int(SUMMARY.search(node.lines[idx][1]).group(2))
        time.sleep(args.window)
        d1, h1, t1 = cpu_of([root]), cpu_of(helpers), time.time()
        last = [SUMMARY.search(line) for _, line in node.lines if SUMMARY.search(line)][-1]
        s1 = int(last.group(2))
        steps_per_s = (s1 - s0) / (t1 - t0)
        return {"system": system, "workers": nproc, "shim": shim, "window_s": round(t1 - t0, 2),
                "daemon_cpu_pct": round(100 * (d1 - d0) / (t1 - t0), 2),
                "zygote_cpu_pct": round(100 * (h1 - h0) / (t1 - t0), 2) if helpers else None,
                "steps_per_s": round(steps_per_s, 1),
                "reports_per_s": round(steps_per_s * nproc, 1) if shim else 0,
                "loadavg_start": load0, "loadavg_end": os.getloadavg()}
    finally:
        node.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--step-time", type=float, default=0.0, help="toy job sleep per step for the step-time runs")
    parser.add_argument("--cpu-step-time", type=float, default=0.02, help="toy job sleep per step for the CPU runs")
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2, help="step-time runs per system (interleaved)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "daemon_overhead.json"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    logdir = out.parent / "logs"
    logdir.mkdir(exist_ok=True)
    started = time.time()
    order = ["torchrun", "elasticd", "elasticd-shim"]
    runs = []
    for i in range(args.rounds):  # ABC, CBA, ...: drift in background load hits every system alike
        for system in (order if i % 2 == 0 else order[::-1]):
            runs.append(step_time(system, args, logdir))
            print(f"  step time {system}: median {runs[-1]['median_step_s']}", flush=True)
    steps = []
    for system in order:
        mine = [r for r in runs if r["system"] == system and r["median_step_s"] is not None]
        agg = {"system": system, "runs": mine, "loadavg_start": mine[0]["loadavg_start"] if mine else None,
               "loadavg_end": mine[-1]["loadavg_end"] if mine else None}
        for k in ("median_step_s", "mean_step_s", "p90_step_s"):
            agg[k] = statistics.median(r[k] for r in mine) if mine else None
        agg["per_run_median_s"] = [round(r["median_step_s"], 5) for r in mine]
        steps.append(agg)
    cpu = [daemon_cpu("torchrun", 2, False, args, logdir), daemon_cpu("elasticd", 2, False, args, logdir),
           daemon_cpu("elasticd", 8, True, args, logdir)]
    for c in cpu:
        print(f"  cpu {c}", flush=True)
    result = {"args": vars(args), "duration_s": round(time.time() - started, 1), "step_time": steps, "cpu": cpu}
    out.write_text(json.dumps(result, indent=1))
    md = ["### Daemon overhead", "", f"Step time, world 4 (2 nodes x 2 workers), toy job with --step-time "
          f"{args.step_time} s and a checkpoint every step; median over {args.steps} steps after {args.warmup}, "
          f"median of {args.rounds} interleaved runs per system:", "",
          "| system | median step (ms) | mean (ms) | p90 (ms) | per-run medians (ms) | load start→end |",
          "|---|---|---|---|---|---|"]
    for s in steps:
        if s["median_step_s"] is None:
            md.append(f"| {s['system']} | — | — | — | — | |")
            continue
        md.append(f"| {s['system']} | {1000 * s['median_step_s']:.2f} | {1000 * s['mean_step_s']:.2f} | "
                  f"{1000 * s['p90_step_s']:.2f} | {', '.join(f'{1000 * x:.2f}' for x in s['per_run_median_s'])} | "
                  f"{s['loadavg_start'][0]:.1f}→{s['loadavg_end'][0]:.1f} |")
    md += ["", f"Agent/daemon CPU over {args.window:.0f} s (one node; toy job --step-time {args.cpu_step_time}):", "",
           "| process | workers | shim reports/s | steps/s | daemon CPU % | zygote CPU % |",
           "|---|---|---|---|---|---|"]
    for c in cpu:
        md.append(f"| {c['system']} {'(shim)' if c['shim'] else '(plain, idle channel)'} | {c['workers']} | "
                  f"{c['reports_per_s']} | {c['steps_per_s']} | {c['daemon_cpu_pct']} | {c['zygote_cpu_pct'] or '—'} |")
    text = "\n".join(md) + "\n"
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
