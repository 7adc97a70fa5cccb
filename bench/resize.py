"""In-place resize benchmark: one job, three ways, in one run — elasticd in place, elasticd's restart, torchrun.

The job is examples/train_shim.py (2 nodes x 2 workers on 127.0.0.1, --step-time 0.02, a checkpoint every 10
steps; --script hsdp: examples/train_fsdp.py, a transformer sharded by HSDP), run as:
  in-place  elasticd (zygote), the script's default: survivors keep their processes (trainer_shim.Elastic)
  restart   elasticd (zygote), the same script with --no-in-place: every change stops and forks every worker
  torchrun  torchrun --rdzv-backend c10d --rdzv-conf last_call_timeout=1 (tuned), --max-restarts 5

One lifetime goes through: b joins, `elasticd drain b`, `elasticd scale 2`, SIGTERM to b's daemon (or agent),
b joins again, SIGKILL of one of a's workers, SIGKILL of b's daemon (or agent) with its workers. torchrun has no
drain or scale: those rows say n/a. Per event:
  stall       rank 0's last step in the old world -> its first step in the new one (the `t=` its lines print)
  parts       in place: the `resize` event's own stall (`event_stall_s`, from the first rank's leaving its group)
              and where it went (leave, group, rebuild, plan, transfer, first step, other)
  steps_lost  that last old step minus the step the new world started from (0: nothing trained again); a crash
              also loses the compute of the step that was in flight, which no step number shows
  ckpt_read   whether the new world's rank 0 started from a checkpoint file (elasticd: a `checkpoint_skipped`
              aside, we read `start_step` of a fresh process)
Usage: resize.py [--repeat 1] [--systems in-place,restart,torchrun,in-place-base] [--base-tree DIR]
                 [--state-mb MB] [--events join,drain,...] [--out bench/results/resize.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from procs import (
    BASE,
    PY,
    ROOT,
    Launched,
    base_tree_env,
    free_port,
    kill_all,
    on_signal,
    require_base_tree,
    tree,
    write_report,
)

# --script: the job, by its path in a checkout (train_fsdp.py: --mesh hsdp; train_titan.py: torchtitan-shaped, 117
# DTensors; titan_variant.py: the same model with mixed precision, tied weights, clipping and a foreach AdamW)
SCRIPTS = {"ddp": "examples/train_shim.py", "hsdp": "examples/train_fsdp.py", "titan": "examples/train_titan.py",
           "titan-variant": "bench/titan_variant.py"}
SYSTEMS = ["in-place", "restart", "torchrun"]
EVENTS = ["join", "drain", "scale", "sigterm_leave", "rejoin", "worker_crash", "node_sigkill"]
TARGETS = {"join": 0.15, "drain": 0.15, "scale": 0.15, "sigterm_leave": 0.15, "rejoin": 0.15, "worker_crash": 0.5,
           "node_sigkill": 1.5}  # seconds of stall for in-place (issue 13)
STEP = re.compile(r"step=(\d+) world_size=(\d+) loss=\S+ t=([\d.]+)")
WORLD = re.compile(r"world_size=(\d+) round=(\d+) start_step=(\d+) .* pid=(\d+) t=([\d.]+)")
STEADY = 8  # steps of the new world before the next event


class Node(Launched):
    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path, job: Job) -> None:
        self.name, self.job = name, job
        super().__init__(cmd, env, log)

    def on_line(self, now: float, line: str) -> None:
        if m := WORLD.search(line):
            self.job.add(("world", float(m[5]), int(m[3]), int(m[1]), int(m[4])))
        elif m := STEP.search(line):
            self.job.add(("step", float(m[3]), int(m[1]), int(m[2]), 0))


class Job:
    def __init__(self, system: str, rep: int, args: argparse.Namespace, logdir: Path) -> None:
        self.system, self.args, self.logdir = system, args, logdir
        self.kind = system.removesuffix(BASE)
        self.tmp = Path(tempfile.mkdtemp(prefix=f"bench-resize-{system}-{rep}-"))
        self.port = free_port()
        self.job_id = f"resize-{system}-{rep}-{os.getpid()}"
        self.env = dict(os.environ, ELASTICD_RUNTIME_DIR=str(self.tmp / "rt"), PYTHONUNBUFFERED="1",
                        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
        if system.endswith(BASE):  # its daemons, workers and CLI import the other checkout's elasticd and shim
            self.env.update(base_tree_env(args.base_tree))
        self.records: list[tuple[str, float, int, int, int]] = []  # (kind, t, step, world, pid)
        self.cond = threading.Condition()
        self.nodes: dict[str, Node] = {}

    def add(self, rec: tuple[str, float, int, int, int]) -> None:
        with self.cond:
            self.records.append(rec)
            self.cond.notify_all()

    def cmd(self, node: str) -> list[str]:
        # A -base system runs the other checkout's copy of the script: the script puts its own checkout first on
        # sys.path, so this tree's would import this tree's trainer_shim.
        name = SCRIPTS[self.args.script]
        path = Path(self.args.base_tree) / name if self.system.endswith(BASE) else ROOT / name
        ckpt_every = "0" if self.args.state_mb else "10"  # a state of 1 GB is not saved every 10 steps
        script = [str(path), "--steps", "1000000", "--ckpt-dir", str(self.tmp / "ckpt"), "--ckpt-every", ckpt_every,
                  "--step-time", str(self.args.step_time), "--batch", "16", "--micro", "8",
                  *(["--log-every", "1"] if self.args.script == "ddp" else []),
                  *(["--state-mb", str(self.args.state_mb)] if self.args.state_mb else [])]
        if self.kind == "restart":
            script.append("--no-in-place")
        common = ["--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                  "--rdzv-id", self.job_id, "--max-restarts", "5"]
        if self.system == "torchrun":
            return [PY, "-m", "torch.distributed.run", "--rdzv-backend", "c10d", *common, "--rdzv-conf",
                    "last_call_timeout=1", *script]
        return [PY, "-m", "elasticd.cli", "start", *common, "--node-id", node, "--log-dir", str(self.tmp / "logs"),
                "--grace-period", "3", *script]

    def launch(self, node: str) -> Node:
        n = Node(node, self.cmd(node), self.env, self.logdir / f"{self.job_id}-{node}.log", self)
        self.nodes[node] = n
        return n

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "elasticd.cli", *argv, "--job", self.job_id], env=self.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=30)

    def new_world(self, after: float, world: int, timeout: float) -> tuple[float, int, int]:
        """The first world line of that size printed after `after`, then STEADY steps in it: (t, start, pid)."""
        deadline = time.time() + timeout
        with self.cond:
            while True:
                worlds = [r for r in self.records if r[0] == "world" and r[1] > after and r[3] == world]
                if worlds:
                    w = worlds[0]
                    steps = [r for r in self.records if r[0] == "step" and r[1] > w[1]]
                    if len(steps) >= STEADY:
                        return w[1], w[2], w[4]
                left = deadline - time.time()
                if left <= 0:
                    raise TimeoutError(f"no world of {world} after {after:.3f}")
                self.cond.wait(min(left, 0.5))

    def measure(self, world_t: float, start_step: int) -> dict[str, Any]:
        with self.cond:
            old = [r for r in self.records if r[0] == "step" and r[1] < world_t]
            new = [r for r in self.records if r[0] == "step" and r[1] > world_t]
        last, first = max(old, key=lambda r: r[1]), min(new, key=lambda r: r[1])
        return {"stall_s": round(first[1] - last[1], 3), "last_old_step": last[2], "start_step": start_step,
                "first_new_step": first[2], "steps_lost": max(0, last[2] - start_step)}

    def worker_pids(self, node: str) -> list[int]:
        """The node's live workers now (elasticd: from its latest `workers_started` event, never stale)."""
        if self.system == "torchrun":
            return [p.pid for p in tree(self.nodes[node].proc.pid)[1:]
                    if SCRIPTS[self.args.script] in " ".join(p.cmdline())]
        started = self.started(node)
        return [pid for pid in started.get("pids", []) if psutil.pid_exists(pid)]

    def started(self, node: str) -> dict[str, Any]:
        """The node's latest `workers_started` event: its workers' pids, and those kept in place."""
        cp = self.cli("events", "--json", "--kind", "workers_started")
        found = [e for e in json.loads(cp.stdout)["events"] if e["node"] == node]
        return found[-1] if found else {}

    def resize_parts(self, world: int) -> dict[str, Any]:
        """The latest `resize` event of that world: the stall the job measured itself, and where it went."""
        cp = self.cli("events", "--json", "--kind", "resize")
        found = [e for e in json.loads(cp.stdout or "{}").get("events", []) if e.get("world_size") == world]
        return {"event_stall_s": found[-1].get("stall_s"), "parts": found[-1].get("parts")} if found else {}

    def stop(self) -> None:
        for n in self.nodes.values():
            if n.proc.poll() is None:
                kill_all(tree(n.proc.pid)[:1], signal.SIGTERM)
        for n in self.nodes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                n.proc.wait(10)
            kill_all(tree(n.proc.pid))
            with contextlib.suppress(Exception):
                n.proc.wait(5)
            n.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def lifetime(system: str, rep: int, args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    job = Job(system, rep, args, logdir)
    out: dict[str, Any] = {"system": system, "rep": rep, "loadavg_start": os.getloadavg(), "events": {}}
    a_pids: set[int] = set()
    try:
        t = time.time()
        job.launch("a")
        job.new_world(t, 2, args.timeout)
        a_pids = set(job.worker_pids("a"))

        def event(name: str, world: int, act: Any) -> None:
            if name not in args.events.split(","):
                return
            t_ev = time.time()
            how = act()
            if how == "n/a":
                out["events"][name] = {"n/a": True}
                return
            try:
                world_t, start, _ = job.new_world(t_ev, world, args.timeout)
            except TimeoutError:
                out["events"][name] = {"timed_out": True}
                print(f"  [{system}] {name}: timed out", flush=True)
                return
            kept = [] if system == "torchrun" else job.started("a").get("kept", [])
            res = {**job.measure(world_t, start), "a_pids_kept": sorted(kept),
                   **(job.resize_parts(world) if system.startswith("in-place") else {})}
            out["events"][name] = res
            print(f"  [{system}] {name}: {res}", flush=True)

        def sigterm_b() -> str:
            job.nodes["b"].proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                job.nodes["b"].proc.wait(30)
            return "sigterm"

        def crash() -> str:
            victim = max(job.worker_pids("a"))
            os.kill(victim, signal.SIGKILL)
            return "sigkill worker"

        torchrun = system == "torchrun"
        event("join", 4, lambda: job.launch("b"))
        event("drain", 2, lambda: "n/a" if torchrun else job.cli("drain", "b"))
        event("scale", 4, lambda: "n/a" if torchrun else job.cli("scale", "2"))
        event("sigterm_leave", 2, sigterm_b)
        event("rejoin", 4, lambda: job.launch("b"))
        event("worker_crash", 4, crash)
        event("node_sigkill", 2, lambda: kill_all(tree(job.nodes["b"].proc.pid)))
        out["a_pids_start"] = sorted(a_pids)
    except Exception as exc:
        out["error"] = repr(exc)
        print(f"  [{system}] error: {exc!r}", flush=True)
    finally:
        out["loadavg_end"] = os.getloadavg()
        job.stop()
    return out


def summarize(runs: list[dict[str, Any]], systems: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for ev in EVENTS:
        table[ev] = {}
        for system in systems:
            rows = [r["events"].get(ev, {}) for r in runs if r["system"] == system]
            stalls = [x["stall_s"] for x in rows if "stall_s" in x]
            lost = [x["steps_lost"] for x in rows if "steps_lost" in x]
            table[ev][system] = {"n/a": all(x.get("n/a") for x in rows) and bool(rows),
                                 "stall_s": statistics.median(stalls) if stalls else None,
                                 "steps_lost": max(lost) if lost else None, "n": len(stalls)}
    return table


def stall(cell: dict[str, Any]) -> str:
    return "n/a" if cell["n/a"] else ("timeout" if cell["stall_s"] is None else f"{cell['stall_s']:.3f}")


def markdown(result: dict[str, Any]) -> str:
    systems, table = result["systems"], result["table"]
    head = ["event", *[f"{s} stall (s)" for s in systems], *[f"{s} lost" for s in systems], "in-place target",
            "restart / in-place"]
    lines = [f"## In-place resize vs restart vs torchrun-tuned ({result['platform']}, {os.cpu_count()} cores, "
             f"load {result['loadavg'][0]:.2f} {result['loadavg'][1]:.2f} {result['loadavg'][2]:.2f})", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for ev in [e for e in EVENTS if e in result["args"]["events"].split(",")]:
        cells = table[ev]
        ip, rs = cells.get("in-place", {}).get("stall_s"), cells.get("restart", {}).get("stall_s")
        ratio = f"{rs / ip:.1f}x" if ip and rs else "-"
        stalls = [stall(cells[s]) for s in systems]
        lost = ["n/a" if cells[s]["n/a"] or cells[s]["steps_lost"] is None else str(cells[s]["steps_lost"])
                for s in systems]
        lines.append("| " + " | ".join([ev, *stalls, *lost, f"<= {TARGETS[ev]}", ratio]) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per event")
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--base-tree", default="", help="the checkout that the `-base` systems run")
    parser.add_argument("--state-mb", type=int, default=0, help="each rank's state carries this many MB more "
                        "(train_shim.py --state-mb): what a heal moves")
    parser.add_argument("--events", default=",".join(EVENTS), help="the events to run, in their order")
    parser.add_argument("--script", choices=sorted(SCRIPTS), default="ddp", help="ddp: examples/train_shim.py; "
                        "hsdp: examples/train_fsdp.py (a sharded transformer, in place only since this tree); "
                        "titan: examples/train_titan.py (torchtitan-shaped)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "resize.json"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    systems = [s for s in args.systems.split(",") if s]
    if bad := [s for s in systems if s.removesuffix(BASE) not in SYSTEMS or s == "torchrun" + BASE]:
        parser.error(f"unknown system(s) {bad}; choose from {SYSTEMS} (in-place and restart may end in {BASE})")
    require_base_tree(parser, systems, args.base_tree)
    out = Path(args.out)
    logdir = out.parent / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    started, runs = time.time(), []
    for rep in range(args.repeat):  # systems interleaved: background load drifts over all of them alike
        for system in systems:
            print(f"== {system} lifetime {rep + 1} (load {os.getloadavg()[0]:.2f})", flush=True)
            runs.append(lifetime(system, rep, args, logdir))
    result = {"args": vars(args), "systems": systems, "duration_s": round(time.time() - started, 1),
              "platform": platform.platform(), "python": sys.version.split()[0], "loadavg": os.getloadavg(),
              "cpu_count": os.cpu_count(), "table": summarize(runs, systems), "runs": runs}
    write_report(out, result, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
