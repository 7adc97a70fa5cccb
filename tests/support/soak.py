"""Chaos soak: a seeded schedule of faults against a real local job, then the invariants that say nothing was lost.

Test-support code: tests/reliability/test_chaos.py runs it for 1 minute and bench/chaos_soak.py is its CLI (bench may
import tests' support code, never the reverse).

A 3-node job (a is the coordinator; nproc 1 per node) runs examples/train_shim.py with a checkpoint every
step and a sample log. For --minutes, 3-6 s after the job is stepping again, the schedule injects one
fault: a worker SIGKILLed, a worker SIGSTOPped (a hang; daemons run with --hang-timeout 5), a member
daemon SIGKILLed and started again, a drain/scale storm, rapid operator commands (checkpoint, cordon,
uncordon, restart; interlock refusals are fine), or a flapping node (stopped and started several times).
The coordinator is never touched (the embedded one; its failover on etcd: tests/daemon/test_etcd_failover.py).
Then the job runs to its target step, and the invariants are checked:

  target      the job succeeded and rank 0 printed step=--steps
  steps_lost  per new round, (last step printed before) - (start_step) <= --ckpt-every
  one_world   no global rank is held by two rounds' workers at once (workers_started/_stopped event times)
  no_orphans  no process with the job id survives, and no zombie children
  causes      every round_started has a cause in start/failure/membership/operator/hang
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import re
import signal
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from elasticd.client import ClientError
from support.harness import SHIM, Job, job_processes, wait_gone

NODES = ("a", "b", "c")
MEMBERS = ("b", "c")  # the coordinator a is never faulted
CAUSES = {"start", "failure", "membership", "operator", "hang"}
FAULTS = {"worker_sigkill": 3, "worker_sigstop": 2, "daemon_kill_restart": 2, "drain_scale_storm": 2,
          "rapid_operator": 2, "flapping_node": 1}


@dataclass(frozen=True)
class SoakConfig:
    minutes: float  # how long the fault schedule runs (with `faults`: the most it may run)
    seed: int
    steps: int  # the job's target step
    ckpt_every: int = 1
    step_time: float = 0.2
    finish_timeout: float = 600.0  # seconds to wait for the job's end after the schedule
    faults: int = 0  # if set, the schedule ends once this many faults were injected: a loaded machine recovers
    # from each more slowly, and a schedule of minutes would then test fewer faults


class Events:
    """Every job event, polled from the coordinator in the background (the job log is the evidence)."""

    def __init__(self, job: Job) -> None:
        self.job, self.items, self.seq = job, [], 0
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        client = None
        while not self.stop.is_set():
            try:
                client = client or self.job.client("a")
                got = client.call("events", since_seq=self.seq, limit=0, timeout_s=3)["events"]
                with self.lock:
                    self.items += [e for e in got if e["seq"] > self.seq]
                    self.seq = max([self.seq, *(e["seq"] for e in got)])
            except (ClientError, OSError, KeyError):
                if client is not None:
                    client.close()
                client = None
            self.stop.wait(0.25)
        if client is not None:
            client.close()

    def of(self, kind: str, since: int = 0) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in self.items if e["kind"] == kind and e["seq"] > since]

    def wait(self, kind: str, match: Any = lambda e: True, since: int = 0, timeout: float = 30.0) -> dict | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.of(kind, since) if match(e)]
            if found:
                return found[0]
            time.sleep(0.1)
        return None


class Soak:
    def __init__(self, cfg: SoakConfig, tmp: Path) -> None:
        self.cfg, self.tmp = cfg, tmp
        self.rng = random.Random(cfg.seed)
        self.job = Job(tmp, nnodes=f"1:{len(NODES)}", nproc=1, max_restarts=10_000,
                       extra=["--hang-timeout", "5", "--grace-period", "2"])
        self.script = [f"--steps={cfg.steps}", f"--ckpt-dir={tmp / 'ckpt'}", f"--ckpt-every={cfg.ckpt_every}",
                       f"--step-time={cfg.step_time}", "--batch=12", "--micro=4", f"--sample-log={tmp / 'samples'}"]
        self.faults: Counter[str] = Counter()
        self.log: list[dict[str, Any]] = []  # every fault: kind, node, time, notes
        self.kills: dict[str, list[float]] = defaultdict(list)  # node -> times its daemon was SIGKILLed
        self.refusals = 0
        self.events: Events | None = None

    # ---- the job ---------------------------------------------------------------------------------------
    def start(self, node: str) -> None:
        self.job.start(node, SHIM, *self.script)

    def running(self, timeout: float = 40.0) -> bool:
        """The job runs a round whose workers have stepped (or time is up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(ClientError, OSError):
                status = self.job.status()
                if status["state"] != "running":
                    if status["state"] in ("succeeded", "failed", "stopped"):
                        return False
                elif self.events and self.events.of("first_step", 0) and \
                        self.events.of("first_step")[-1]["round"] == status["round"]:
                    return True
            time.sleep(0.2)
        return False

    def call(self, op: str, **args: Any) -> str:
        try:
            with self.job.client("a") as client:
                client.call(op, **args)
            return "ok"
        except ClientError as err:
            self.refusals += err.code in ("refused", "not_running", "bad_argument")
            return err.code

    def workers(self) -> dict[str, list[int]]:
        """node -> pids of its current round's workers (from workers_started)."""
        assert self.events is not None
        latest: dict[str, dict[str, Any]] = {}
        for e in self.events.of("workers_started"):
            latest[e["node"]] = e
        alive = {n["node_id"] for n in self.job.status()["nodes"] if n["status"] == "alive"}
        return {n: [p for p in e["pids"] if psutil.pid_exists(p)] for n, e in latest.items() if n in alive}

    # ---- faults ----------------------------------------------------------------------------------------
    def worker_sigkill(self) -> dict[str, Any]:
        node, pids = self.rng.choice(sorted((n, p) for n, p in self.workers().items() if p))
        os.kill(pids[0], signal.SIGKILL)
        return {"node": node, "pid": pids[0]}

    def worker_sigstop(self) -> dict[str, Any]:
        node, pids = self.rng.choice(sorted((n, p) for n, p in self.workers().items() if p))
        assert self.events is not None
        mark = self.events.seq
        os.kill(pids[0], signal.SIGSTOP)
        hung = self.events.wait("round_started", lambda e: e["cause"] in ("hang", "failure"), since=mark, timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[0], signal.SIGCONT)  # if the daemon has not reaped it yet
        return {"node": node, "pid": pids[0], "detected": bool(hung), "cause": hung and hung["cause"]}

    def daemon_kill_restart(self) -> dict[str, Any]:
        alive = [n for n in MEMBERS if self.job.daemons[n].proc.poll() is None]
        node = self.rng.choice(alive)
        self.kills[node].append(time.time())
        wait_gone(self.job.daemons[node].kill_with_workers())
        self.start(node)
        return {"node": node}

    def drain_scale_storm(self) -> dict[str, Any]:
        results = []
        for _ in range(self.rng.randint(1, 3)):
            node = self.rng.choice(MEMBERS)
            assert self.events is not None
            mark = self.events.seq
            results.append(("drain", node, outcome := self.call("drain", node=node)))
            if outcome == "ok":  # the drained world forms, then scale brings the node back
                self.events.wait("round_started", since=mark, timeout=40)
            results.append(("scale", len(NODES), self.call("scale", nodes=len(NODES))))
        return {"ops": results}

    def rapid_operator(self) -> dict[str, Any]:
        node = self.rng.choice(MEMBERS)
        ops = [("checkpoint", {}), ("cordon", {"node": node}), ("uncordon", {"node": node}), ("restart", {}),
               ("checkpoint", {}), ("uncordon", {"node": node})]
        assert self.events is not None
        mark = self.events.seq
        results = [(op, self.call(op, **kw)) for op, kw in ops]
        # An uncordon while the cordon is in flight is refused; an operator would retry once it completed.
        # Without that the job shrinks to one node for the rest of the run and later faults hit non-members.
        self.events.wait("cordon_complete", since=mark, timeout=40)
        results.append(("uncordon", self.call("uncordon", node=node)))
        return {"ops": results}

    def flapping_node(self) -> dict[str, Any]:
        node = self.rng.choice(MEMBERS)
        flaps = self.rng.randint(2, 4)
        for _ in range(flaps):
            daemon = self.job.daemons[node]
            daemon.stop()  # SIGTERM: a graceful leave
            self.start(node)
            self.job.daemons[node].wait_line(r"control \S+", 60)
        return {"node": node, "flaps": flaps}

    # ---- the run ---------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        started = time.time()
        for node in NODES:
            self.start(node)
        self.events = Events(self.job)
        end_schedule = time.monotonic() + self.cfg.minutes * 60
        kinds, weights = zip(*FAULTS.items(), strict=True)
        while time.monotonic() < end_schedule and not (self.cfg.faults and self.faults.total() >= self.cfg.faults):
            if not self.running():
                break  # finished early (or failed): the invariants will say which
            time.sleep(self.rng.uniform(3, 6))  # the schedule's gap: let the job make progress
            kind = self.rng.choices(kinds, weights)[0]
            at = time.time()
            try:
                notes = getattr(self, kind)()
            except (IndexError, ClientError, OSError, AssertionError) as err:
                notes = {"skipped": repr(err)}
            else:
                self.faults[kind] += 1
            self.log.append({"kind": kind, "at": round(at - started, 1), **notes})
            print(f"[{at - started:6.1f}s] {kind} {notes}", flush=True)
        if self.job.daemons["a"].proc.poll() is None and not self.events.of("job_end"):
            for node in MEMBERS:  # whatever the schedule left: every node back, every node active
                if self.job.daemons[node].proc.poll() is not None:
                    self.start(node)
            for node in MEMBERS:
                self.call("uncordon", node=node)
            self.call("scale", nodes=len(NODES))
        schedule_s = time.time() - started
        end = self.events.wait("job_end", timeout=self.cfg.finish_timeout)
        codes = {n: self.exit_code(n) for n in NODES}
        self.events.stop.set()
        self.events.thread.join(10)
        return self.verdict(started, schedule_s, end, codes)

    def exit_code(self, node: str) -> int | None:
        try:
            return self.job.daemons[node].wait_exit(60)
        except Exception:
            return None

    # ---- invariants ------------------------------------------------------------------------------------
    def verdict(self, started: float, schedule_s: float, end: dict | None, codes: dict) -> dict[str, Any]:
        assert self.events is not None
        rounds = self.events.of("round_started")
        causes = Counter(e["cause"] for e in rounds)
        steps, lost = self.rank0_steps()
        overlaps = self.overlaps(end["ts"] if end else time.time())
        self.job.close()
        orphans = wait_gone(job_processes(self.job.job_id), 20)
        zombies = [p.pid for p in psutil.Process().children(recursive=True)  # ours: the process runs other tests too
                   if p.status() == psutil.STATUS_ZOMBIE and p.create_time() >= started]
        invariants = {
            "target": {"ok": bool(end and end["state"] == "succeeded") and steps == self.cfg.steps,
                       "job_end": end and {k: end[k] for k in ("state", "reason")}, "last_step": steps,
                       "exit_codes": codes},
            "steps_lost": {"ok": all(x["lost"] <= self.cfg.ckpt_every for x in lost),
                           "max": max((x["lost"] for x in lost), default=0), "per_round": lost},
            "one_world": {"ok": not overlaps, "overlaps": overlaps[:10]},
            "no_orphans": {"ok": not orphans and not zombies, "orphans": orphans, "zombies": zombies},
            "causes": {"ok": all(e["cause"] in CAUSES for e in rounds), "bad": [e for e in rounds
                                                                             if e["cause"] not in CAUSES]},
        }
        return {
            "load": {"nodes": len(NODES), "workers_per_node": 1, "steps": self.cfg.steps,
                     "ckpt_every": self.cfg.ckpt_every, "step_time": self.cfg.step_time,
                     "schedule_s": round(schedule_s, 1), "total_s": round(time.time() - started, 1),
                     "seed": self.cfg.seed, "minutes": self.cfg.minutes},
            "faults": dict(self.faults), "fault_log": self.log, "operator_refusals": self.refusals,
            "rounds": len(rounds), "restarts_by_cause": dict(causes), "events": len(self.events.items),
            "steps_lost_max": invariants["steps_lost"]["max"], "invariants": invariants,
            "ok": all(v["ok"] for v in invariants.values()),
        }

    def rank0_steps(self) -> tuple[int, list[dict[str, Any]]]:
        """Rank 0 (node a, sticky) per round: start_step, and the steps lost since the last step printed before."""
        base = self.tmp / "logs" / self.job.job_id / "a"
        last, lost = 0, []
        for path in sorted(base.glob("round-*/rank-0.log")):
            text = path.read_text(errors="replace")
            start = re.search(r"start_step=(\d+)", text)
            if start:
                s = int(start.group(1))
                lost.append({"round": int(path.parent.name.split("-")[1]), "start_step": s,
                             "last_before": last, "lost": max(0, last - s)})
            printed = [int(m) for m in re.findall(r"^step=(\d+) ", text, re.M)]
            last = max([last, *printed])
        return last, lost

    def overlaps(self, end_ts: float) -> list[str]:
        """Per global rank, the time spans of each round's worker; spans of different rounds must not overlap."""
        assert self.events is not None
        stopped = {(e["node"], e["round"]): e["ts"] for e in self.events.of("workers_stopped")}
        exited = defaultdict(list)
        for e in self.events.of("worker_exited"):
            exited[(e["node"], e["round"])].append(e["ts"])
        spans: dict[int, list[tuple[float, float, int, str]]] = defaultdict(list)
        for e in self.events.of("workers_started"):
            key = (e["node"], e["round"])
            kills = [k for k in self.kills[e["node"]] if k >= e["ts"]]
            ends = [t for t in (stopped.get(key), min(kills, default=None),
                                max(exited[key], default=None) if len(exited[key]) == len(e["ranks"]) else None)
                    if t is not None]
            for rank in e["ranks"]:
                spans[rank].append((e["ts"], min(ends, default=end_ts), e["round"], e["node"]))
        found = []
        for rank, items in spans.items():
            items.sort()
            for (_s1, e1, r1, n1), (s2, _e2, r2, n2) in itertools.pairwise(items):
                if r1 != r2 and s2 < e1:
                    found.append(f"rank {rank}: round {r1} on {n1} until {e1:.3f} overlaps round {r2} on {n2} "
                                 f"from {s2:.3f}")
        return found


def summary(r: dict[str, Any]) -> str:
    inv = r["invariants"]
    lines = [f"chaos soak: {r['load']}",
             f"faults injected: {r['faults']} (operator refusals: {r['operator_refusals']})",
             f"rounds: {r['rounds']}; restarts by cause: {r['restarts_by_cause']}; events: {r['events']}",
             f"steps lost max: {r['steps_lost_max']} (checkpoint every {r['load']['ckpt_every']})"]
    for name, v in inv.items():
        detail = json.dumps({k: x for k, x in v.items() if k != "ok"}, default=str)[:300]
        lines.append(f"  {name:11} {'OK' if v['ok'] else 'FAIL'}  {detail}")
    lines.append("RESULT: " + ("all invariants hold" if r["ok"] else "INVARIANT VIOLATED"))
    return "\n".join(lines)

