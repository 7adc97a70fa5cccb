"""Coordinator scale: the real Coordinator in process on tests/support/sim.py's fake mesh, for N nodes of 8 workers.

`bench/scale_sim.py --nodes 256,1024,2048,4096 --out bench/results/scale-sim.json` reports per N: the first
round (registration storm of N nodes), then a join, a drain and a node loss, each with the coordinator's own
CPU seconds (time spent inside `receive` and `tick` only, not the simulator's), the frames and bytes it sent
(heartbeat answers apart: they are steady traffic), false `node_lost` events, one `status` call's time, and
the steady CPU per simulated second with nothing happening, again with every rank reporting its step
(`steady_shim_cpu_per_s`), and with its allreduce wait too (`steady_measured_cpu_per_s`, one node a straggler).

`--etcd` keeps the job's state in a real etcd (`etcd` on PATH; a one-member cluster on 127.0.0.1, as the etcd
tests start it) through `EtcdStore`, synced every 0.1 s of simulated time as the elected coordinator does, and
adds per phase the etcd writes (ops in txns, and their bytes) and the longest `put_round` wait; the CPU then
includes the store's writer thread. It also keeps `--leases` leases alive as that many daemons would (each
refreshed every third of its 5 s TTL, through etcd's JSON gateway as elasticd does) for 10 s, and reports etcd's
own CPU for it: liveness through etcd is etcd's work, not the coordinator's.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # bench -> tests, never the reverse
from support.etcd_cluster import EtcdCluster
from support.sim import Msg, Sim, verb

from elasticd.coordinator.etcd.client import EtcdClient, created_at, put
from elasticd.coordinator.etcd.store import Batch, EtcdStore
from elasticd.daemon.failover import SYNC_EVERY_S
from elasticd.daemon.takeover import job_record
from elasticd.wire.names import EventKind, MeshOp

WORKERS = 8
STEADY_S = 10.0  # simulated seconds of quiet heartbeats to measure the steady cost


class Meter:
    """CPU seconds inside the coordinator's two entry points (and a store's sync), and what it sent, since the last
    `take`; with an EtcdStore, what it queued for etcd and the longest wait for a round to be durable."""

    def __init__(self, sim: Sim, store: EtcdStore | None = None) -> None:
        self.sim, self.cpu, self.store = sim, 0.0, store
        c = sim.coordinator
        for name in ("receive", "tick"):
            setattr(c, name, self._timed(getattr(c, name)))
        self.mark = 0
        self.etcd_ops = self.etcd_bytes = 0
        self.round_wait = 0.0
        if store is not None:
            self.sync = self._timed(store.sync)
            queued = store.queue.put
            store.queue.put = self._counted(queued)  # type: ignore[method-assign]
            store.put_round = self._waited(store.put_round)  # type: ignore[method-assign]

    def _counted(self, queue_put: Any) -> Any:
        def counted(batch: Batch | None, *args: Any, **kw: Any) -> None:
            if batch is not None:
                self.etcd_ops += len(batch.ops)
                self.etcd_bytes += len(json.dumps(batch.ops))
            queue_put(batch, *args, **kw)
        return counted

    def _waited(self, fn: Any) -> Any:
        def waited(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.round_wait = max(self.round_wait, time.perf_counter() - start)
        return waited

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
        if self.store is not None:
            out.update(etcd_ops=self.etcd_ops, etcd_mb=round(self.etcd_bytes / 1e6, 3),
                       round_durable_s=round(self.round_wait, 3))
        self.cpu, self.mark, self.etcd_ops, self.etcd_bytes, self.round_wait = 0.0, len(self.sim.sent), 0, 0, 0.0
        return out


def etcd_store(cluster: EtcdCluster, nodes: int) -> EtcdStore:
    """A store under a leader key of our own, as an elected coordinator's (elasticd/daemon/failover.py)."""
    client = EtcdClient([("127.0.0.1", p) for p in cluster.client_ports])
    prefix = f"/elasticd/scale{nodes}/"
    key = f"{prefix}leader/{client.grant(60):x}"
    epoch = int(client.txn([created_at(key, 0)], [put(key, "{}")])["header"]["revision"])
    return EtcdStore(client, prefix, key, epoch, event_capacity=25 * nodes, fresh=True)


def lease_load(cluster: EtcdCluster, leases: int, seconds: float = 10.0, ttl: int = 5) -> dict[str, Any]:
    """etcd's CPU while `leases` daemons keep their leases alive (refresh every ttl/3, 16 client threads)."""
    client = EtcdClient([("127.0.0.1", p) for p in cluster.client_ports])
    ids = [client.grant(ttl) for _ in range(leases)]
    etcd = [psutil.Process(p.pid) for p in cluster.procs if p is not None]
    refreshed, end = 0, time.monotonic() + seconds
    cpu0 = sum(p.cpu_times().user + p.cpu_times().system for p in etcd)
    with ThreadPoolExecutor(16) as pool:
        while time.monotonic() < end:
            due = time.monotonic() + ttl / 3
            refreshed += sum(1 for _ in pool.map(client.refresh, ids))
            time.sleep(max(0.0, due - time.monotonic()))
    cpu = sum(p.cpu_times().user + p.cpu_times().system for p in etcd) - cpu0
    for lease in ids:
        client.revoke(lease)
    return {"leases": leases, "refreshes_per_s": round(refreshed / seconds, 1),
            "etcd_cpu_pct": round(100 * cpu / seconds, 1), "etcd_cpu_us_per_refresh": round(1e6 * cpu / refreshed, 1)}


def run(nodes: int, cluster: EtcdCluster | None = None) -> dict[str, Any]:
    ids = [f"gpu-{i:05d}.example.internal" for i in range(nodes)]
    store = etcd_store(cluster, nodes) if cluster is not None else None
    sim = Sim(ids, nproc=WORKERS, min_nodes=1, max_nodes=nodes + 1, store=store)
    meter = Meter(sim, store)
    if store is not None:
        c = sim.coordinator
        store.job_state = lambda: job_record(c)
        store.events_since = lambda seq: c.events.query(since_seq=seq, limit=0)

        def sync() -> None:
            meter.sync()
            sim.sched.later(SYNC_EVERY_S, sync)
        sim.sched.later(SYNC_EVERY_S, sync)
    result: dict[str, Any] = {"nodes": nodes, "workers": nodes * WORKERS}
    sim.start()
    started = sim.clock.now
    sim.formed(timeout=600)
    result["formation"] = {**meter.take(), "sim_s": round(sim.clock.now - started, 3)}
    steps: list[tuple[str, Any]] = [
        ("join", lambda: sim.add("newcomer").start()),
        ("drain", lambda: verb(sim.coordinator, "drain", {"node": ids[-1]})),
        ("node_loss", lambda: sim.nodes[ids[3]].kill()),
    ]
    for name, change in steps:
        # A full collection first, outside the meter: one that the last phase's garbage would set off must not
        # land in whichever round comes next (a 2,048-node heap takes ~60 ms); the steady columns carry their share.
        gc.collect()
        before = sim.round.round_id
        started = sim.clock.now
        change()
        sim.formed(before + 1, timeout=120)
        result[name] = {**meter.take(), "sim_s": round(sim.clock.now - started, 3)}
    sim.run(STEADY_S)
    result["steady_cpu_per_s"] = round(meter.take()["coordinator_cpu_s"] / STEADY_S, 4)
    # The same quiet with every rank reporting its step (shim scripts), then also its allreduce wait (scripts that
    # call Elastic.watch), one node the straggler: the second against the first is what naming stragglers costs.
    for name, wait in (("steady_shim_cpu_per_s", None), ("steady_measured_cpu_per_s", 0.05)):
        sim.configure(shim=True, wait_s=wait)
        sim.nodes[ids[1]].wait_s = 0.0 if wait else None
        sim.run(STEADY_S)
        meter.take()  # the first beats carry every rank's report whole; the steady state sends what changed
        sim.run(3 * STEADY_S)  # three of the straggler check's looks, not one
        result[name] = round(meter.take()["coordinator_cpu_s"] / (3 * STEADY_S), 4)
    result["stragglers_named"] = sorted(sim.coordinator.stragglers.named)
    start = time.perf_counter()
    sim.coordinator.status(sim.clock.now)
    result["status_s"] = round(time.perf_counter() - start, 4)
    result["false_node_lost"] = sum(1 for e in sim.events if e["kind"] == EventKind.node_lost and e["node"] != ids[3])
    if store is not None:
        store.close()
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
    parser.add_argument("--etcd", action="store_true", help="the job's state in a real etcd (`etcd` on PATH)")
    parser.add_argument("--leases", type=int, default=512, help="with --etcd: leases kept alive for the lease load")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    cluster = None
    if args.etcd:
        binary = shutil.which("etcd")
        if binary is None:
            print("scale_sim: --etcd needs `etcd` on PATH (Debian: apt-get install etcd-server)", file=sys.stderr)
            return 2
        cluster = EtcdCluster(binary, Path(tempfile.mkdtemp())).start()
    extra: dict[str, Any] = {}
    try:
        runs = [run(int(n), cluster) for n in args.nodes.split(",")]
        if cluster is not None:
            extra["lease_load"] = lease_load(cluster, args.leases)
    finally:
        if cluster is not None:
            cluster.close()
    publish({"machine": f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}", "runs": runs,
             **extra}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
