"""Warm spares: a node lost, drained, SIGTERMed or found unhealthy, with a spare to take its place and without.

The job is examples/train_shim.py in place (trainer_shim.Elastic), --nnodes 2:3 with one worker per node on
127.0.0.1, --step-time 0.02: three daemons (`no-spare`), or four (`spare`: the fourth waits as a standby with its
workers pre-started). Each lifetime starts the job, waits for steady steps at world 3, then does one event to node b:
  lost       SIGKILL of b's daemon and its workers
  drained    `elasticd drain b`
  sigterm    SIGTERM to b's daemon (a preemption notice)
  unhealthy  b's --health-check starts failing (checked every 0.5 s); `verdict_to_world_s` is the node_unhealthy
             event to the first step of the new world
Per event (bench/resize.py's measures): stall (rank 0's last step in the old world -> its first in the new one),
steps lost, and the new world's size (3 with a spare in place, 2 without).
Usage: spare.py [--repeat 2] [--systems spare,no-spare] [--events lost,drained,sigterm,unhealthy]
                [--out bench/results/spare.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from procs import PY, ROOT, kill_all, on_signal, tree, write_report
from resize import Job as ResizeJob

SYSTEMS = ["spare", "no-spare"]
EVENTS = ["lost", "drained", "sigterm", "unhealthy"]


class SpareJob(ResizeJob):
    """bench/resize.py's job, at --nnodes 2:3 with one worker per node, and a health check per node."""

    def cmd(self, node: str) -> list[str]:
        script = [str(ROOT / "examples" / "train_shim.py"), "--steps", "1000000", "--ckpt-dir", str(self.tmp / "ckpt"),
                  "--ckpt-every", "10", "--step-time", str(self.args.step_time), "--batch", "24", "--micro", "4",
                  "--log-every", "1"]
        flag = self.tmp / f"sick-{node}"
        return [PY, "-m", "elasticd.cli", "start", "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-endpoint",
                f"127.0.0.1:{self.port}", "--rdzv-id", self.job_id, "--max-restarts", "5", "--node-id", node,
                "--log-dir", str(self.tmp / "logs"), "--grace-period", "3", "--health-interval", "0.5",
                "--health-check", f"test ! -e {flag} || {{ echo 'bench: node {node} marked sick'; exit 1; }}",
                *script]

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        return list(json.loads(self.cli("events", "--json", "--kind", kind).stdout)["events"])


def lifetime(system: str, event: str, rep: int, args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    job = SpareJob(f"{system}-{event}", rep, args, logdir)
    out: dict[str, Any] = {"system": system, "event": event, "rep": rep, "loadavg_start": os.getloadavg()}
    try:
        t = time.time()
        job.launch("a")  # first: it hosts the coordinator, and b (the node each event hits) never does
        deadline = time.time() + args.timeout
        while job.cli("status").returncode != 0:
            assert time.time() < deadline, "node a's daemon never answered"
            time.sleep(0.2)
        for node in "bc":
            job.launch(node)
        job.new_world(t, 3, args.timeout)
        if system == "spare":
            job.launch("d")
            deadline = time.time() + args.timeout
            while not any(e["node"] == "d" for e in job.events_of("node_joined")):
                assert time.time() < deadline, "the spare never joined"
                time.sleep(0.2)
            time.sleep(2.0)  # its workers pre-start and wait (warm)
        t_ev = time.time()
        if event == "lost":
            kill_all(tree(job.nodes["b"].proc.pid))
        elif event == "drained":
            job.cli("drain", "b")
        elif event == "sigterm":
            job.nodes["b"].proc.send_signal(signal.SIGTERM)
        else:
            (job.tmp / "sick-b").touch()
        world = 3 if system == "spare" else 2
        world_t, start, _ = job.new_world(t_ev, world, args.timeout)
        out |= {"world_after": world, **job.measure(world_t, start), "event_to_world_s": round(world_t - t_ev, 3)}
        if event == "unhealthy":
            verdict = next(e for e in job.events_of("node_unhealthy") if e["node"] == "b")
            out["verdict_to_world_s"] = round(world_t - verdict["ts"], 3)
    except Exception as exc:
        out["error"] = repr(exc)
    finally:
        out["loadavg_end"] = os.getloadavg()
        job.stop()
    print(f"  [{system} {event} #{rep}] {({k: v for k, v in out.items() if k not in ('system', 'event', 'rep')})}",
          flush=True)
    return out


def median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else None


def summarize(runs: list[dict[str, Any]], systems: list[str], events: list[str]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for event in events:
        for system in systems:
            rows = [r for r in runs if r["system"] == system and r["event"] == event and "stall_s" in r]
            table[f"{event}/{system}"] = {"n": len(rows), "stall_s": median(rows, "stall_s"),
                                          "world_after": median(rows, "world_after"),
                                          "verdict_to_world_s": median(rows, "verdict_to_world_s"),
                                          "steps_lost": max((r["steps_lost"] for r in rows), default=None)}
    return table


def shown(value: float | None, form: str = "{:.3f}") -> str:
    return "-" if value is None else form.format(value)


def markdown(result: dict[str, Any]) -> str:
    lines = [f"## Warm spares ({result['platform']}, {result['cpu_count']} cores, load {result['loadavg'][0]:.2f} at "
             f"the end; {result['args']['repeat']} lifetime(s) per cell, medians)", "",
             "| event | system | world after | stall (s) | verdict → new world (s) | steps lost |",
             "|---|---|---|---|---|---|"]
    for key, cell in result["table"].items():
        event, system = key.split("/")
        lines.append(f"| {event} | {system} | {shown(cell['world_after'], '{:.0f}')} | {shown(cell['stall_s'])} | "
                     f"{shown(cell['verdict_to_world_s'])} | {shown(cell['steps_lost'], '{}')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--events", default=",".join(EVENTS))
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "spare.json"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    systems, events = args.systems.split(","), args.events.split(",")
    if bad := (set(systems) - set(SYSTEMS)) | (set(events) - set(EVENTS)):
        parser.error(f"unknown {sorted(bad)}; systems {SYSTEMS}, events {EVENTS}")
    out = Path(args.out)
    logdir = out.parent / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    started, runs = time.time(), []
    for rep in range(args.repeat):
        for event in events:
            for system in systems:  # side by side: each event with and without a spare, back to back
                runs.append(lifetime(system, event, rep, args, logdir))
    result = {"args": vars(args), "duration_s": round(time.time() - started, 1), "platform": platform.platform(),
              "python": sys.version.split()[0], "loadavg": os.getloadavg(), "cpu_count": os.cpu_count(),
              "table": summarize(runs, systems, events), "runs": runs}
    write_report(out, result, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
