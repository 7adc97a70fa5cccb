"""Coordinator loss: seconds from a SIGKILL of the coordinator's node to the first step in the smaller world.

3 nodes x 1 worker of bench/toy_job.py on 127.0.0.1 (--nnodes 2:3); once the world of 3 steps steadily, the
coordinator's node (elasticd: the elected one, from `status`; torchrun c10d: node a, the store host; torchrun
etcd-v2 has none: node a) is SIGKILLed together with its workers. Each system runs in the same process,
interleaved per repetition:

  elasticd-etcd      elasticd --rdzv-backend etcd, a 3-member etcd 3.4 (lease --lease-ttl, default 3 s)
  torchrun-etcd-v2   torchrun --rdzv-backend etcd-v2 on the same kind of cluster started with --enable-v2
                     (torch's v2-API backend, through python-etcd)
  torchrun-c10d      torchrun --rdzv-backend c10d: node a hosts the TCPStore, so its loss ends the job
  elasticd-etcd-base elasticd-etcd as another checkout has it (--base-tree DIR, e.g. a `git worktree` of the
                     commit to compare with): the same run, side by side
  elasticd-etcd-tls  elasticd-etcd on a 3-member etcd with TLS for clients and peers, client certificates
                     required and authentication on (RBAC: the daemons log in as a user whose role holds the
                     job's prefix), through tests/support/etcd_tls.py

The result is the first BENCH_STEP at world 2 from a process started after the kill; a system that never gets
there within --timeout is reported as such, with how its processes ended.

Usage: failover.py [--repeat 3] [--systems a,b] [--lease-ttl 3] [--timeout 90] [--base-tree DIR]
                   [--out bench/results/failover.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from procs import PY, ROOT, TOY, kill_all, on_signal, require_base_tree, tree, write_report
from recovery import Job, Node, Rec, Timeout, charged

sys.path.insert(0, str(ROOT / "tests"))
from support.etcd_cluster import EtcdCluster
from support.etcd_tls import Authority, enable_rbac

PASSWORD = "bench-trainer-pw"

SYSTEMS = ["elasticd-etcd", "torchrun-etcd-v2", "torchrun-c10d", "elasticd-etcd-base", "elasticd-etcd-tls"]
DEFAULT_SYSTEMS = SYSTEMS[:3]
NODES = "abc"
TARGET_S = 5.0


class FailoverJob(Job):
    """recovery.py's job, 3 nodes x 1 worker, with the rendezvous each system uses."""

    def __init__(self, system: str, rep: int, args: argparse.Namespace, logdir: Path, etcd: EtcdCluster | None,
                 conf: str = ""):
        super().__init__(system, rep, args, logdir)
        self.etcd = etcd  # elasticd-etcd-base runs from --base-tree as every `-base` system of recovery.py's Job
        self.conf = conf  # elasticd-etcd-tls: the certificates and the login, as --rdzv-conf

    def cmd(self, node: str) -> list[str]:
        script = [str(TOY), "--ckpt", str(self.ckpt), "--step-time", str(self.args.step_time)]
        common = ["--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-id", self.job_id, "--max-restarts", "3"]
        if self.elasticd:
            assert self.etcd is not None
            return [PY, "-m", "elasticd.cli", "start", *common, "--rdzv-backend", "etcd", "--rdzv-endpoint",
                    self.etcd.endpoints, "--rdzv-conf", f"lease_ttl={self.args.lease_ttl}{self.conf}",
                    "--node-id", node,
                    "--log-dir", str(self.tmp / "logs"), *script]
        if self.system == "torchrun-etcd-v2":
            assert self.etcd is not None
            return [PY, "-m", "torch.distributed.run", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint",
                    self.etcd.endpoints.split(",")[0], *common, *script]
        return [PY, "-m", "torch.distributed.run", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                f"127.0.0.1:{self.port}", *common, *script]


def secured_etcd(binary: str, folder: Path) -> tuple[EtcdCluster, str]:
    """A TLS etcd with authentication on, and the --rdzv-conf settings that let a daemon in."""
    ca = Authority(folder, "ca")
    server, admin, nodes = ca.issue("etcd", server=True), ca.issue("admin"), ca.issue("nodes")
    etcd = EtcdCluster(binary, folder, size=3, tls=server, admin=admin).start()
    enable_rbac(etcd.url(0), admin, {"trainer": (PASSWORD, "/elasticd/")})
    secret = folder / "password"
    secret.write_text(PASSWORD)
    return etcd, (f",cacert={server.ca},cert={nodes.cert},key={nodes.key},user=trainer,password_file={secret}")


def lifetime(system: str, rep: int, args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    etcd, conf = None, ""
    if system == "elasticd-etcd-tls":
        etcd, conf = secured_etcd(args.etcd, Path(tempfile.mkdtemp(prefix="bench-etcd-")))
    elif system != "torchrun-c10d":
        etcd = EtcdCluster(args.etcd, Path(tempfile.mkdtemp(prefix="bench-etcd-")), size=3,
                           enable_v2=system == "torchrun-etcd-v2").start()
    job = FailoverJob(system, rep, args, logdir, etcd, conf)
    out: dict[str, Any] = {"system": system, "rep": rep, "loadavg_start": os.getloadavg()}
    try:
        t_launch = time.time()
        for node in NODES:
            job.launch(node)
            if system == "torchrun-c10d" and node == "a":  # a hosts the store: the others wait for it to listen
                deadline = time.time() + 30
                while not job.nodes["a"].listening(job.port) and time.time() < deadline:
                    time.sleep(0.05)
        first = job.new_world_step(3, t_launch, args.timeout)
        job.steady(first)
        charged_before = job.restarts()
        victim = coordinator(job) if job.elasticd else "a"
        out["killed"] = victim
        victims = tree(job.nodes[victim].proc.pid)
        t_kill = time.time()
        kill_all(victims)
        survivors = [job.nodes[n] for n in NODES if n != victim]
        after = smaller_world(job, survivors, t_kill, args.timeout)
        if after is not None:
            job.steady(after)
            out |= {"seconds": round(after.t - t_kill, 3), **job.loss(t_kill, after),
                    **charged(system, charged_before, job.restarts())}
        else:
            out |= {"seconds": None, "survivors_exit": {n.name: n.proc.poll() for n in survivors},
                    "ended_after_s": round(time.time() - t_kill, 3)}
        if job.elasticd:
            out["rounds"] = elected(job)
    except Exception as exc:
        out["error"] = repr(exc)
    finally:
        out["loadavg_end"] = os.getloadavg()
        job.stop()
        if etcd is not None:
            etcd.close()
            shutil.rmtree(etcd.dirs[0].parent, ignore_errors=True)
    shown = f"{out['seconds']:.2f} s" if out.get("seconds") is not None else f"no world of 2 ({out})"
    print(f"  [{system} #{rep}] coordinator loss -> first step at world 2: {shown}", flush=True)
    return out


def smaller_world(job: FailoverJob, survivors: list[Node], t_kill: float, timeout: float) -> Rec | None:
    """The first step at world 2 after the kill; None once every survivor has exited (the job ended) or at timeout."""
    deadline = t_kill + timeout
    while time.time() < deadline:
        with contextlib.suppress(Timeout):
            return job.new_world_step(2, t_kill, 1.0)
        if not any(n.alive() for n in survivors):
            return None
    return None


def coordinator(job: FailoverJob) -> str:
    """The node elasticd elected (whichever daemon's candidacy reached etcd first)."""
    _, cp = job.cli("status", "--json")
    return str(json.loads(cp.stdout)["coordinator"])


def elected(job: FailoverJob) -> list[dict[str, Any]]:
    """elasticd's own account: who was elected, when the old node was found lost, the round's timeline."""
    try:
        _, cp = job.cli("events", "--json", "--kind", "coordinator_elected", "--kind", "node_lost",
                        "--kind", "first_step")
        events = json.loads(cp.stdout)["events"]
    except Exception as exc:
        return [{"error": repr(exc)}]
    return [{k: e.get(k) for k in ("ts", "kind", "node", "epoch", "reason", "timeline")} for e in events]


def summarize(runs: list[dict[str, Any]], systems: list[str]) -> dict[str, Any]:
    summary = {}
    for system in systems:
        mine = [r for r in runs if r["system"] == system]
        done = [r for r in mine if r.get("seconds") is not None]
        vals = sorted(r["seconds"] for r in done)
        summary[system] = {"n": len(mine), "recovered": len(vals), "median": statistics.median(vals) if vals else None,
                           "min": vals[0] if vals else None, "max": vals[-1] if vals else None,
                           "steps_lost": [r.get("steps_lost") for r in done],
                           # torchrun: over every surviving agent (node a's own count died with it)
                           "restarts_charged": [r.get("restarts_charged_total", r.get("restarts_charged"))
                                                for r in done]}
    return summary


def markdown(result: dict[str, Any]) -> str:
    a = result["args"]
    lines = ["### Coordinator loss: SIGKILL of the coordinator's node (and its worker) to the first step at world 2",
             "",
             f"3 nodes x 1 worker, toy job step time {a['step_time']} s; elasticd lease {a['lease_ttl']} s; "
             f"timeout {a['timeout']:.0f} s; {result['platform']}; load average at start "
             f"{result['loadavg_start'][0]:.2f}.", "",
             f"| system | recovered | median (min-max) s | target ≤ {TARGET_S:g} s | steps lost | restarts charged |",
             "|---|---|---|---|---|---|"]
    for system, s in result["summary"].items():
        cell = (f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})" if s["median"] is not None
                else "never: the survivors exit 1, the job ends")
        lines.append(f"| {system} | {s['recovered']}/{s['n']} | {cell} | "
                     f"{'met' if s['median'] is not None and s['median'] <= TARGET_S else '—'} | {s['steps_lost']} | "
                     f"{s['restarts_charged']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS))
    parser.add_argument("--base-tree", default="", help="the checkout elasticd-etcd-base runs")
    parser.add_argument("--lease-ttl", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--etcd", default=shutil.which("etcd") or "/usr/bin/etcd")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "failover.json"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    systems = [s for s in args.systems.split(",") if s]
    if unknown := set(systems) - set(SYSTEMS):
        parser.error(f"unknown system(s) {sorted(unknown)}; choose from {SYSTEMS}")
    require_base_tree(parser, systems, args.base_tree)
    out = Path(args.out)
    logdir = out.parent / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    started, load = time.time(), os.getloadavg()
    runs = []
    for rep in range(args.repeat):  # interleaved: drift in background load hits every system alike
        for system in systems:
            print(f"== {system} lifetime {rep + 1} (load {os.getloadavg()[0]:.2f})", flush=True)
            runs.append(lifetime(system, rep, args, logdir))
    result = {"args": vars(args), "started": started, "duration_s": round(time.time() - started, 1),
              "loadavg_start": load, "loadavg_end": os.getloadavg(), "platform": platform.platform(),
              "cpus": os.cpu_count(), "runs": runs, "summary": summarize(runs, systems)}
    write_report(out, result, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
