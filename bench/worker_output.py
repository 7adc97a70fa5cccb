"""Worker output under load: the daemon's CPU with 8 ranks printing 1,000 lines a second each, beside torchrun's
agent teeing the same, with and without `logs` followers; and the `logs` verb's latency, local and through the mesh.

One run, side by side (torchrun and each elasticd setting in turn, the same workers, the same window):
1. CPU (psutil user+sys over --window s) of the process that reads the workers' output:
   - torchrun --tee 3 --log-dir (its agent tails each worker's files to its own stdout): the baseline;
   - elasticd (it reads each worker's pipe, writes its log file and echoes it, as by default);
   - elasticd with --followers followers, each polling one rank's `logs --since` 4 times a second through the
     coordinator (another node's daemon), as `elasticd logs NODE RANK --follow` does; the coordinator's CPU too.
   The printing node's daemon is `b`; `a` holds the coordinator and quiet workers (1 line a second).
2. Latency of `logs NODE RANK --tail 20` (--calls calls each, while the ranks print): asked of the node's own
   daemon (local) and of the coordinator (it asks the node over the mesh); `status` of the coordinator beside them.

Usage: worker_output.py [--window 10] [--followers 8] [--calls 200] [--out bench/results/worker_output.json]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from procs import PY, ROOT, CpuMeter, free_port, on_signal, stop_tree, write_report

from elasticd.client import Client

CHATTER = ROOT / "bench" / "chatter.py"
NPROC = 8
CONTROL = re.compile(r"control (\S+)")


class Agent:
    """An agent or daemon whose output goes to a file (a reader in this process would compete for the CPU)."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 120) -> re.Match[str]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with open(self.log, "rb") as handle:
                head = handle.read(1 << 20).decode(errors="replace")
            if match := pattern.search(head):
                return match
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.log} exited {self.proc.returncode}:\n{head[-2000:]}")
            time.sleep(0.2)
        raise TimeoutError(pattern.pattern)

    def stop(self) -> None:
        stop_tree(self.proc, 10)


def log_lines(folder: Path) -> int:
    return sum(path.read_bytes().count(b"\n") for path in folder.rglob("*.log") if path.is_file())


def measure(agents: list[Agent], window: float) -> list[float]:
    meters = [CpuMeter(agent.proc.pid) for agent in agents]
    time.sleep(window)
    return [round(100 * meter.take() / window, 1) for meter in meters]


def torchrun(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """Its agent's CPU with quiet ranks, then with loud ones."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    loud = tmp / "loud-torchrun"
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(NPROC), "--tee", "3",
           "--log-dir", str(tmp / "torchrun-logs"), str(CHATTER), "--rate", str(args.rate), "--loud-while", str(loud)]
    agent = Agent(cmd, env, tmp / "torchrun.out")
    rows = []
    try:
        agent.wait_for(re.compile(r"line 1\."))
        for setting in ("torchrun --tee 3, quiet ranks", "torchrun --tee 3"):
            if setting == "torchrun --tee 3":
                loud.touch()
                time.sleep(1.0)
            load, lines0 = os.getloadavg()[0], log_lines(tmp / "torchrun-logs")
            (cpu,) = measure([agent], args.window)
            rows.append({"setting": setting, "reader_cpu_pct": cpu, "coordinator_cpu_pct": None,
                         "lines_per_s": round((log_lines(tmp / "torchrun-logs") - lines0) / args.window),
                         "followers": 0, "follower_lines_per_s": None, "load": load})
        return rows
    finally:
        agent.stop()


class Elastic:
    """Node `a` (coordinator, quiet ranks) and node `b` (ranks printing --rate lines a second each)."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.tmp, self.logs, self.loud = tmp, tmp / "elasticd-logs", tmp / "loud-elasticd"
        port = free_port()
        self.job_id = f"bench-output-{port}"
        env = dict(os.environ, ELASTICD_RUNTIME_DIR=str(tmp / "rt"), PYTHONUNBUFFERED="1")
        self.agents: dict[str, Agent] = {}
        for node in ("a", "b"):
            cmd = [PY, "-m", "elasticd.cli", "start", "--nnodes", "2", "--nproc-per-node", str(NPROC),
                   "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", self.job_id, "--node-id", node,
                   "--log-dir", str(self.logs), "--preload", "json", str(CHATTER), "--rate", str(args.rate),
                   "--loud-node", "b", "--loud-while", str(self.loud)]
            self.agents[node] = Agent(cmd, env, tmp / f"elasticd-{node}.out")
            if node == "a":
                time.sleep(1.0)  # a binds the rendezvous endpoint first
        self.control = {node: agent.wait_for(CONTROL)[1] for node, agent in self.agents.items()}
        self.agents["b"].wait_for(re.compile(r"line 1\."))
        with Client(self.control["a"]) as client:
            self.ranks = next(e["ranks"] for e in client.call("status")["rank_map"] if e["node_id"] == "b")

    def cpu(self, window: float, followers: int, setting: str) -> dict[str, Any]:
        stop, got, errors = threading.Event(), [0] * followers, []
        threads = [threading.Thread(target=self.follow, args=(self.ranks[i % len(self.ranks)], stop, got, i, errors))
                   for i in range(followers)]
        for thread in threads:
            thread.start()
        time.sleep(1.0 if followers else 0)  # the followers have read their tails
        load, lines0, got0 = os.getloadavg()[0], log_lines(self.logs / self.job_id / "b"), sum(got)
        b_cpu, a_cpu = measure([self.agents["b"], self.agents["a"]], window)
        rate, followed = (log_lines(self.logs / self.job_id / "b") - lines0) / window, (sum(got) - got0) / window
        stop.set()
        for thread in threads:
            thread.join(10)
        return {"setting": setting, "reader_cpu_pct": b_cpu,
                "coordinator_cpu_pct": a_cpu, "lines_per_s": round(rate), "followers": followers,
                "follower_lines_per_s": round(followed) if followers else None, "errors": errors[:3], "load": load}

    def follow(self, rank: int, stop: threading.Event, got: list[int], index: int, errors: list[str]) -> None:
        with Client(self.control["a"]) as client:
            offset = client.call("logs", node="b", rank=rank, tail=1)["ranks"][0]["offset"]
            while not stop.wait(0.25):
                try:
                    entry = client.call("logs", node="b", rank=rank, since=offset)["ranks"][0]
                except Exception as exc:  # counted in the report
                    errors.append(repr(exc))
                    continue
                offset, got[index] = entry["offset"], got[index] + len(entry["lines"])

    def latency(self, calls: int) -> list[dict[str, Any]]:
        """Interleaved: each round asks local, mesh and status once, so load drift hits all three alike."""
        asks = {"logs, local (the node's daemon)": ("b", "logs", {"node": "b", "rank": self.ranks[0], "tail": 20}),
                "logs, through the mesh (the coordinator)": ("a", "logs", {"node": "b", "rank": self.ranks[0],
                                                                            "tail": 20}),
                "status (the coordinator)": ("a", "status", {})}
        clients = {node: Client(control) for node, control in self.control.items()}
        took: dict[str, list[float]] = {name: [] for name in asks}
        try:
            for _ in range(calls):
                for name, (node, op, body) in asks.items():
                    started = time.perf_counter()
                    clients[node].call(op, **body)
                    took[name].append(time.perf_counter() - started)
        finally:
            for client in clients.values():
                client.close()
        return [{"call": name, "median_ms": round(1000 * statistics.median(t), 2),
                 "p95_ms": round(1000 * sorted(t)[int(0.95 * len(t))], 2), "calls": len(t)} for name, t in took.items()]

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()


def markdown(result: dict[str, Any]) -> str:
    args = result["args"]
    md = ["### Worker output", "", f"{NPROC} ranks each printing {args['rate']} lines a second (~70 bytes a line; "
          "quiet: 1 line a second); "
          f"CPU over {args['window']:.0f} s; load = the 1-minute load average at the window's start.", "",
          "| setting | reader CPU % | coordinator CPU % | lines/s to the log files | followers' lines/s | load |",
          "|---|---|---|---|---|---|"]
    for row in result["cpu"]:
        md.append(f"| {row['setting']} | {row['reader_cpu_pct']} | {row['coordinator_cpu_pct'] or '—'} | "
                  f"{row['lines_per_s']} | {row['follower_lines_per_s'] or '—'} | {row['load']:.1f} |")
    md += ["", "The reader is torchrun's agent, or elasticd's daemon on the printing node.", "",
           f"`logs --tail 20` latency, {args['calls']} calls each, interleaved, while the ranks print:", "",
           "| call | median (ms) | p95 (ms) |", "|---|---|---|"]
    md += [f"| {row['call']} | {row['median_ms']} | {row['p95_ms']} |" for row in result["latency"]]
    return "\n".join(md) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=1000, help="lines a second per rank")
    parser.add_argument("--followers", type=int, default=8)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "worker_output.json"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tmp = Path(tempfile.mkdtemp(prefix="bench-output-"))
    started = time.time()
    try:
        cpu = torchrun(args, tmp)
        job = Elastic(args, tmp)
        try:
            cpu.append(job.cpu(args.window, 0, "elasticd, quiet ranks"))
            job.loud.touch()
            time.sleep(1.0)
            cpu += [job.cpu(args.window, 0, "elasticd"),
                    job.cpu(args.window, args.followers, f"elasticd, {args.followers} followers"),
                    job.cpu(args.window, 50, "elasticd, 50 followers")]
            latency = job.latency(args.calls)
        finally:
            job.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"args": vars(args), "duration_s": round(time.time() - started, 1), "cpu": cpu, "latency": latency,
              "machine": f"{os.cpu_count()} cores"}
    write_report(Path(args.out), result, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
