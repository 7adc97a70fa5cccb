"""Coordinator scale: the real Coordinator in process on tests/sim.py's fake mesh, for N nodes of 8 workers.

`bench/scale_sim.py --nodes 256,1024,2048,4096 --out bench/results/scale-sim.json` reports per N: the first
round (registration storm of N nodes), then a join, a drain and a node loss, each with the coordinator's own
CPU seconds (time spent inside `receive` and `tick` only, not the simulator's), the frames and bytes it sent
(heartbeat answers apart: they are steady traffic), false `node_lost` events, one `status` call's time, and
the steady CPU per simulated second with nothing happening.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # bench -> tests, never the reverse
from sim import Msg, Sim

from elasticd.commands import REGISTRY
from elasticd.names import EventKind, MeshOp

WORKERS = 8
STEADY_S = 10.0  # simulated seconds of quiet heartbeats to measure the steady cost


class Meter:
    """CPU seconds inside the coordinator's two entry points, and what it sent, since the last `take`."""

    def __init__(self, sim: Sim) -> None:
        self.sim, self.cpu = sim, 0.0
        c = sim.coordinator
        for name in ("receive", "tick"):
            setattr(c, name, self._timed(getattr(c, name)))
        self.mark = 0

    def _timed(self, fn: Any) -> Any:
        def timed(*args: Any) -> Any:
            start = time.process_time()
            try:
                return fn(*args)
            finally:
                self.cpu += time.process_time() - start
        return timed

    def take(self) -> dict[str, Any]:
        sent: list[Msg] = [m for m in self.sim.sent[self.mark:] if m.src == "coordinator" and m.op != MeshOp.hb]
        out = {"coordinator_cpu_s": round(self.cpu, 3), "frames": len(sent),
               "bytes": sum(len(json.dumps(m.body)) for m in sent)}
        self.cpu, self.mark = 0.0, len(self.sim.sent)
        return out


def run(nodes: int) -> dict[str, Any]:
    ids = [f"gpu-{i:05d}.example.internal" for i in range(nodes)]
    sim = Sim(ids, nproc=WORKERS, min_nodes=1, max_nodes=nodes + 1)
    meter = Meter(sim)
    result: dict[str, Any] = {"nodes": nodes, "workers": nodes * WORKERS}
    sim.start()
    started = sim.clock.now
    sim.formed(timeout=600)
    result["formation"] = {**meter.take(), "sim_s": round(sim.clock.now - started, 3)}
    steps: list[tuple[str, Any]] = [
        ("join", lambda: sim.add("newcomer").start()),
        ("drain", lambda: REGISTRY["drain"].run(sim.coordinator, {"node": ids[-1]})),
        ("node_loss", lambda: sim.nodes[ids[3]].kill()),
    ]
    for name, change in steps:
        before = sim.round.round_id
        started = sim.clock.now
        change()
        sim.formed(before + 1, timeout=120)
        result[name] = {**meter.take(), "sim_s": round(sim.clock.now - started, 3)}
    sim.run(STEADY_S)
    result["steady_cpu_per_s"] = round(meter.take()["coordinator_cpu_s"] / STEADY_S, 4)
    start = time.perf_counter()
    sim.coordinator.status(sim.clock.now)
    result["status_s"] = round(time.perf_counter() - start, 4)
    result["false_node_lost"] = sum(1 for e in sim.events if e["kind"] == EventKind.node_lost and e["node"] != ids[3])
    return result


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def publish(report: dict[str, Any], out: str) -> None:
    """A scale benchmark's report: printed, and written as JSON to `out` when given."""
    text = json.dumps(report, indent=1)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="256,1024,2048", help="comma-separated node counts")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    runs = [run(int(n)) for n in args.nodes.split(",")]
    publish({"machine": f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}", "runs": runs},
            args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
