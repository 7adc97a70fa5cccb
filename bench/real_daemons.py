"""Many real daemons on one machine: `bench/real_daemons.py --nodes 128` forms, takes a join and a SIGKILL.

Every node is a real `elasticd start --no-zygote` (or `--preload=MODULES` with `--preload`) with one plain worker
(tests/support/workers/ticker.py). Reports the
rounds each phase took (one each is the goal), false `node_lost` events, the wall time of each phase and the
coordinator daemon's CPU seconds (psutil, its pid only), then its steady CPU % over 10 s. `--relay-group G`
runs the job with relays of G members (`--rdzv-conf relay_group=G,relay_from=2`: 128 nodes are below the default
threshold of 256), and the victim of the SIGKILL is then a relay.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # bench -> tests, never the reverse
from procs import CpuMeter
from scale_sim import cpu_model, publish
from support.harness import TICKER, Job

from elasticd.wire.names import EventKind

STEADY_S = 10.0
START_GAP_S = 0.05  # between daemon starts: a storm, but the fork/exec of 128 Pythons is spread a little
FORM_TIMEOUT_S = 180.0  # a round of 128 formed in ~4 s here: minutes mean it never will


def rounds_since(job: Job, seq: int) -> list[dict[str, Any]]:
    with job.client() as client:
        return client.call("events", since_seq=seq, kinds=[EventKind.round_started], limit=0)["events"]


def phase(job: Job, meter: CpuMeter, seq: int, world: int, start: float) -> dict[str, Any]:
    """Wait for a completed round of `world` ranks after `seq`; what it took."""
    started = job.wait_event(EventKind.round_started, since=seq, timeout=FORM_TIMEOUT_S,
                             match=lambda e: e["world_size"] == world)
    done = job.wait_event(EventKind.round_complete, since=seq, timeout=FORM_TIMEOUT_S,
                          match=lambda e: e["round"] == started["round"])
    elapsed = time.monotonic() - start
    return {"wall_s": round(elapsed, 2), "rounds": len(rounds_since(job, seq)), "coordinator_cpu_s": meter.take(),
            "round": done["round"], "timeline": done.get("timeline", {})}


def keep_output(job: Job, logs: Path) -> dict[str, str]:
    """Each daemon's stderr to `logs/<node>.log`; returns the last line of each daemon that exited.

    A daemon still alive that never printed its start line is stuck: SIGABRT makes it print where
    (PYTHONFAULTHANDLER, set by `main`) before its output is kept.
    """
    logs.mkdir(parents=True, exist_ok=True)
    stuck = [d for d in job.daemons.values() if d.proc.poll() is None and not any("elasticd " in x for x in d.lines)]
    for daemon in stuck:
        os.kill(daemon.proc.pid, signal.SIGABRT)
    time.sleep(1.0 if stuck else 0.0)
    exited = {}
    for name, daemon in job.daemons.items():
        (logs / f"{name}.log").write_text("\n".join(daemon.lines) + "\n")
        if daemon.proc.poll() is not None:
            exited[name] = f"exit {daemon.proc.returncode}: {daemon.lines[-1] if daemon.lines else ''}"
    return exited


def run(nodes: int, tmp: Path, logs: Path | None = None, relay_group: int = 0,
        preload: str | None = None) -> dict[str, Any]:
    relays = ["--rdzv-conf", f"relay_group={relay_group},relay_from=2"] if relay_group else []
    spawn = ["--no-zygote"] if preload is None else [f"--preload={preload}"]
    job = Job(tmp, nnodes=f"{nodes}:{nodes + 1}", nproc=1, extra=[*spawn, *relays])
    names = [f"n{i:04d}" for i in range(nodes)]
    try:
        start = time.monotonic()
        job.start(names[0], TICKER, "--interval", "1")
        meter = CpuMeter(job.daemon().proc.pid)
        for name in names[1:]:
            job.start(name, TICKER, "--interval", "1", wait=False)
            time.sleep(START_GAP_S)
        result: dict[str, Any] = {"nodes": nodes, "relay_group": relay_group, "spawn": spawn[0],
                                  "formation": phase(job, meter, 0, nodes, start)}
        seq = job.seq()
        start = time.monotonic()
        job.start("newcomer", TICKER, "--interval", "1", wait=False)
        result["join"] = phase(job, meter, seq, nodes + 1, start)
        seq, victim = job.seq(), names[5]
        if relay_group:  # the worst loss in a job with relays: one that relays for others
            nodes_now = job.status()["nodes"]
            victim = next(n["via"] for n in nodes_now if n["via"])
            result["sigkill_relayed_for"] = sum(n["via"] == victim for n in nodes_now)
        start = time.monotonic()
        job.daemons[victim].kill_with_workers()
        result["sigkill"] = phase(job, meter, seq, nodes, start)
        time.sleep(2.0)
        meter.take()
        time.sleep(STEADY_S)
        result["steady_cpu_pct"] = round(100 * meter.take() / STEADY_S, 1)
        with job.client() as client:
            lost = client.call("events", kinds=[EventKind.node_lost], limit=0)["events"]
        result["false_node_lost"] = sum(1 for e in lost if e["node"] != victim)
        result["node_lost"] = [e["node"] for e in lost]
        result["relays"] = job.status()["relays"]
        result["load_average"] = [round(x, 1) for x in os.getloadavg()]
        return result
    finally:
        if logs is not None:
            exited = keep_output(job, logs)
            print(f"daemons' output in {logs}; exited early: {len(exited)}", file=sys.stderr)
            for name, last in sorted(exited.items())[:20]:
                print(f"  {name}: {last}", file=sys.stderr)
        job.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--out", default="")
    parser.add_argument("--logs", default="", help="keep every daemon's stderr in this folder (<node>.log)")
    parser.add_argument("--relay-group", type=int, default=0, help="members per relay (0: no relays)")
    parser.add_argument("--preload", default=None, help="fork workers from a zygote that imports these modules "
                        "('' for none); default: --no-zygote")
    args = parser.parse_args()
    os.environ["PYTHONFAULTHANDLER"] = "1"  # the daemons inherit it: a stuck one shows where (keep_output)
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(args.logs) if args.logs else None
        result = {"machine": f"{cpu_model()} (shared)",
                  **run(args.nodes, Path(tmp), logs, args.relay_group, args.preload)}
    publish(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
