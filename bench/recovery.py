"""Recovery benchmark: the same toy DDP job under elasticd and under torchrun, in one run.

Every system runs the job as 2 nodes x 2 workers on 127.0.0.1 (node a first: it hosts the rendezvous),
and one job lifetime goes through the events in order:

    cold start -> worker SIGKILL -> graceful leave of b -> b joins -> b SIGKILLed with its workers

Each event is timed as "seconds from the event to the first step of the new world": the first
BENCH_STEP line (bench/toy_job.py) whose world size is the new world's and whose process started
after the event (its `t0`), so a late step of the old world never counts. Steps lost are the last
step completed before the event minus the step the new world resumes from (>= 0). A lifetime is
repeated --repeat times, each in a fresh directory (checkpoint, runtime dir, logs) and port.

Systems (--systems): elasticd (zygote fork server, the default), elasticd-nozygote (--no-zygote),
elasticd-shim (toy job with trainer_shim: report + should_stop, so a drain stops at one agreed step),
torchrun (c10d defaults), torchrun-tuned (--rdzv-conf last_call_timeout=1). Each elasticd system has a twin with
`-base` appended (elasticd-base, elasticd-shim-base, ...) that runs another checkout's elasticd and trainer_shim
(--base-tree DIR, e.g. a `git worktree` of the commit before a change), so a change is measured side by side.

Restarts charged: elasticd's own count (`elasticd status --json` restarts.failure, diffed around each
event). torchrun has no such query: it runs with LOGLEVEL=INFO and we count its agents'
"Worker group FAILED|UNHEALTHY. N/M attempts left; will restart worker group" lines (each one
decrements that agent's --max-restarts budget); we report node a's count (a survives every event) and
the total over both agents.

Usage: recovery.py [--repeat 3] [--systems a,b] [--timeout 120] [--base-tree DIR] [--out bench/results/recovery.json]
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from procs import (
    BASE,
    PY,
    ROOT,
    SEEN_PIDS,
    TOY,
    Launched,
    base_tree_env,
    free_port,
    is_worker,
    kill_all,
    on_signal,
    require_base_tree,
    tree,
    write_report,
)

SYSTEMS = ["elasticd", "elasticd-nozygote", "elasticd-shim", "torchrun", "torchrun-tuned"]
SCENARIOS = ["cold_start", "worker_crash", "graceful_leave", "node_join", "node_kill"]
TARGETS = {"cold_start": 3.0, "worker_crash": 1.0, "graceful_leave": 1.0, "node_join": 1.5, "node_kill": 1.0}
STEADY_STEPS = 6  # steps at the new world before the next event

LINE = re.compile(r"BENCH_(START|RESUME|STEP|DRAINED|EXIT) (.*)")
KV = re.compile(r"(\w+)=(\S+)")
TR_FAILED = re.compile(r"Worker group (FAILED|UNHEALTHY)\. (\d+)/(\d+) attempts left")
TR_WAITING = re.compile(r"Detected (\d+) new nodes")

@dataclass
class Rec:
    kind: str
    node: str
    recv: float
    t: float = 0.0
    step: int = -1
    world: int = 0
    t0: float = 0.0
    pid: int = 0
    extra: dict[str, str] = field(default_factory=dict)


class Node(Launched):
    """One agent/daemon process; its output is parsed into records as it arrives."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path, sink: Job) -> None:
        self.name, self.sink = name, sink
        super().__init__(cmd, env, log)

    def on_line(self, now: float, line: str) -> None:
        m = LINE.search(line)
        if m:
            kv = dict(KV.findall(m.group(2)))
            rec = Rec(m.group(1), self.name, now, float(kv.get("t", 0)), int(kv.get("step", -1)),
                      int(kv.get("world", 0)), float(kv.get("t0", 0)), int(kv.get("pid", 0)), kv)
            if rec.kind == "START" and rec.pid:
                SEEN_PIDS.add(rec.pid)
            self.sink.add(rec)
            return
        m = TR_FAILED.search(line)
        if m:
            self.sink.add(Rec("TR_RESTART", self.name, now, now, extra={"state": m.group(1)}))
        elif TR_WAITING.search(line):
            self.sink.add(Rec("TR_WAITING", self.name, now, now))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def worker(self, local_rank: str) -> tuple[psutil.Process, str] | None:
        """The live worker of this node with LOCAL_RANK=local_rank, by the pids its BENCH_START lines
        announced (a zygote-forked worker's /proc environ is the zygote's, so env matching fails)."""
        pids = {p.pid for p in tree(self.proc.pid)[1:]}
        for rec in reversed(self.sink.snapshot()):
            if rec.kind == "START" and rec.node == self.name and rec.extra.get("local") == local_rank \
                    and rec.pid in pids:
                with contextlib.suppress(psutil.Error):
                    p = psutil.Process(rec.pid)
                    if p.status() != psutil.STATUS_ZOMBIE:
                        return p, rec.extra.get("rank", "?")
        return None

    def listening(self, port: int) -> bool:
        for p in tree(self.proc.pid):
            with contextlib.suppress(psutil.Error):
                for c in p.net_connections("tcp"):
                    if c.status == psutil.CONN_LISTEN and c.laddr.port == port:
                        return True
        return False


class Timeout(Exception):
    pass


class Job:
    """One job lifetime of one system: its nodes, records, and the waits the scenarios need."""

    def __init__(self, system: str, rep: int, args: argparse.Namespace, logdir: Path) -> None:
        self.system, self.args = system, args
        self.kind = system.removesuffix(BASE)  # what runs; a `-base` twin runs it from --base-tree
        self.tmp = Path(tempfile.mkdtemp(prefix=f"bench-{system}-{rep}-"))
        self.port = free_port()
        self.job_id = f"bench-{system}-{rep}-{os.getpid()}"
        self.ckpt = self.tmp / "ckpt.pt"
        self.logdir = logdir
        self.records: list[Rec] = []
        self.cond = threading.Condition()
        self.nodes: dict[str, Node] = {}
        self.env = dict(os.environ, ELASTICD_RUNTIME_DIR=str(self.tmp / "rt"), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
                        PYTHONUNBUFFERED="1")
        if system.startswith("torchrun"):
            self.env["LOGLEVEL"] = "INFO"
        if system.endswith(BASE):  # its daemons, workers and CLI import the other checkout's elasticd
            self.env.update(base_tree_env(args.base_tree))

    @property
    def elasticd(self) -> bool:
        return self.system.startswith("elasticd")

    def add(self, rec: Rec) -> None:
        with self.cond:
            self.records.append(rec)
            self.cond.notify_all()

    def cmd(self, node: str) -> list[str]:
        script = [str(TOY), "--ckpt", str(self.ckpt), "--step-time", str(self.args.step_time)]
        if self.kind == "elasticd-shim":
            script.append("--shim")
        common = ["--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                  "--rdzv-id", self.job_id, "--max-restarts", "3"]
        if self.elasticd:
            extra = ["--no-zygote"] if self.kind == "elasticd-nozygote" else []
            return [PY, "-m", "elasticd.cli", "start", *common, "--node-id", node, "--log-dir",
                    str(self.tmp / "logs"), *extra, *script]
        extra = ["--rdzv-conf", "last_call_timeout=1"] if self.kind == "torchrun-tuned" else []
        return [PY, "-m", "torch.distributed.run", "--rdzv-backend", "c10d", *common, *extra, *script]

    def launch(self, node: str) -> Node:
        n = Node(node, self.cmd(node), self.env, self.logdir / f"{self.job_id}-{node}.log", self)
        self.nodes[node] = n
        return n

    def wait(self, pred, timeout: float, what: str) -> Rec:
        """The first record (in arrival order) matching pred, waiting up to timeout seconds."""
        deadline = time.time() + timeout
        i = 0
        with self.cond:
            while True:
                while i < len(self.records):
                    if pred(self.records[i]):
                        return self.records[i]
                    i += 1
                left = deadline - time.time()
                if left <= 0:
                    raise Timeout(what)
                self.cond.wait(min(left, 0.5))

    def new_world_step(self, world: int, after: float, timeout: float) -> Rec:
        return self.wait(lambda r: r.kind == "STEP" and r.world == world and r.t0 > after and r.t > after,
                         timeout, f"a step at world {world} from a process started after {after:.3f}")

    def steady(self, first: Rec, timeout: float = 30.0) -> None:
        """STEADY_STEPS more steps of the same process as `first`: the new world is really running."""
        self.wait(lambda r: r.kind == "STEP" and r.pid == first.pid and r.step >= first.step + STEADY_STEPS,
                  timeout, "steady steps")

    def snapshot(self) -> list[Rec]:
        with self.cond:
            return list(self.records)

    def loss(self, event_t: float, first: Rec) -> dict[str, Any]:
        recs = self.snapshot()
        before = [r.step for r in recs if r.kind == "STEP" and r.t < event_t]
        old = [r.step for r in recs if r.kind == "STEP" and r.t0 < event_t]
        resume = next((r.step for r in recs if r.kind == "RESUME" and r.pid == first.pid), first.step - 1)
        last_before = max(before) if before else 0
        last_old = max(old) if old else 0
        return {"last_step_before": last_before, "resume_step": resume,
                "steps_lost": max(0, last_before - resume), "steps_redone": max(0, last_old - resume)}

    def cli(self, *argv: str, timeout: float = 20.0) -> tuple[float, subprocess.CompletedProcess]:
        t = time.time()
        cp = subprocess.run([PY, "-m", "elasticd.cli", *argv, "--job", self.job_id], env=self.env, cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout)
        return time.time() - t, cp

    def first_event(self, kind: str, node: str, after: float) -> dict[str, Any] | None:
        """The first `kind` event about `node` since `after`, for elasticd jobs."""
        with contextlib.suppress(Exception):
            _, cp = self.cli("events", "--json", "--kind", kind)
            found = [e for e in json.loads(cp.stdout)["events"] if e["node"] == node and e["ts"] >= after]
            return min(found, key=lambda e: e["ts"]) if found else None
        return None

    def joined_at(self, node: str, after: float) -> float | None:
        """When `node` registered (its node_joined event)."""
        joined = self.first_event("node_joined", node, after)
        return joined["ts"] if joined else None

    def restarts(self) -> dict[str, int] | None:
        if self.elasticd:
            with contextlib.suppress(Exception):
                _, cp = self.cli("status", "--json")
                return dict(json.loads(cp.stdout)["restarts"])
            return None
        recs = self.snapshot()
        return {"a": sum(1 for r in recs if r.kind == "TR_RESTART" and r.node == "a"),
                "b": sum(1 for r in recs if r.kind == "TR_RESTART" and r.node == "b"),
                "waiting": sum(1 for r in recs if r.kind == "TR_WAITING")}

    def stop(self) -> None:
        for n in self.nodes.values():
            if n.alive():
                kill_all(tree(n.proc.pid)[:1], signal.SIGTERM)
        deadline = time.time() + 8
        for n in self.nodes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                n.proc.wait(max(0.1, deadline - time.time()))
        for n in self.nodes.values():
            kill_all(tree(n.proc.pid))
            with contextlib.suppress(Exception):
                n.proc.wait(5)
        for pid in list(SEEN_PIDS):
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if is_worker(p):
                    p.kill()
        for n in self.nodes.values():
            n.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def charged(system: str, before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, Any]:
    if before is None or after is None:
        return {"restarts_charged": None}
    if system.startswith("elasticd"):
        d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        return {"restarts_charged": d.get("failure", 0), "restarts_by_cause": d}
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return {"restarts_charged": d["a"], "restarts_charged_total": d["a"] + d["b"], "tr_waiting_lines": d["waiting"]}


# -- one lifetime ----------------------------------------------------------------------------------
def lifetime(system: str, rep: int, args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    job = Job(system, rep, args, logdir)
    out: dict[str, Any] = {"system": system, "rep": rep, "loadavg_start": os.getloadavg(), "scenarios": {}}
    to = args.timeout
    res = out["scenarios"]

    def record(name: str, event_t: float, first: Rec | None, extra: dict[str, Any] | None = None,
               timed_out: bool = False) -> None:
        entry: dict[str, Any] = {"event_t": event_t, "timed_out": timed_out, **(extra or {})}
        entry["seconds"] = None if timed_out or first is None else round(first.t - event_t, 3)
        if first is not None:
            entry.update(job.loss(event_t, first))
        res[name] = entry
        s = f">{to:.0f} s (timed out)" if timed_out else f"{entry['seconds']:.2f} s"
        print(f"  [{system} #{rep}] {name}: {s} {({k: v for k, v in entry.items() if k not in ('event_t',)})}",
              flush=True)

    try:
        # 1. cold start: a first (it hosts the rendezvous endpoint), b as soon as a listens on it
        t_launch = time.time()
        a = job.launch("a")
        deadline = time.time() + 30
        while not a.listening(job.port) and time.time() < deadline and a.alive():
            time.sleep(0.05)
        t_b = time.time()
        job.launch("b")
        r0 = job.restarts() if not job.elasticd else None
        try:
            first_any = job.wait(lambda r: r.kind == "STEP", to, "first step")
            first = job.new_world_step(4, t_launch, max(1, to - (time.time() - t_launch)))
        except Timeout:
            record("cold_start", t_launch, None, timed_out=True)
            return out
        record("cold_start", t_launch, first, {"first_step_any_world_s": round(first_any.t - t_launch, 3),
                                               "first_any_world": first_any.world,
                                               "b_launched_after_s": round(t_b - t_launch, 3)})
        job.steady(first)
        r0 = job.restarts()

        # 2. one worker of node a SIGKILLed
        found = a.worker("1")
        if found is None:
            raise RuntimeError(f"no LOCAL_RANK=1 worker under node a: {[p.pid for p in tree(a.proc.pid)]}")
        victim, vrank = found
        t_ev = time.time()
        victim.kill()
        try:
            first = job.new_world_step(4, t_ev, to)
        except Timeout:
            record("worker_crash", t_ev, None, timed_out=True)
            return out
        job.steady(first)
        r1 = job.restarts()
        record("worker_crash", t_ev, first, {"victim_rank": vrank, **charged(system, r0, r1)})

        # 3. graceful leave of b: `elasticd drain b`, or SIGTERM to torchrun's agent b
        b = job.nodes["b"]
        extra: dict[str, Any] = {}
        t_ev = time.time()
        if job.elasticd:
            dt, cp = job.cli("drain", "b", "--json")
            extra = {"how": "elasticd drain b", "cli_s": round(dt, 3), "cli_rc": cp.returncode}
            if cp.returncode != 0:  # an interlock (b may hold rank 0 when it registered first): say so, force
                extra["refused"] = (cp.stdout or cp.stderr).strip()[-300:]
                dt, cp = job.cli("drain", "b", "--json", "--force")
                extra.update(how="elasticd drain b --force (refused without)", cli_s=round(time.time() - t_ev, 3),
                             cli_rc=cp.returncode)
        else:
            b.proc.send_signal(signal.SIGTERM)
            extra = {"how": "SIGTERM to agent b"}
        try:
            first = job.new_world_step(2, t_ev, to)
        except Timeout:
            record("graceful_leave", t_ev, None, extra, timed_out=True)
            return out
        job.steady(first)
        r2 = job.restarts()
        drained = [r for r in job.snapshot() if r.kind == "DRAINED" and r.t > t_ev]
        if drained:
            extra["drained_at_step"] = drained[0].step
        record("graceful_leave", t_ev, first, {**extra, **charged(system, r1, r2)})
        # b leaves for good (elasticd keeps a drained node as standby: stop it, which must not re-form a)
        if b.alive():
            b.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            b.proc.wait(20)
        if b.alive():
            kill_all(tree(b.proc.pid))
            b.proc.wait(5)
        if job.elasticd:  # a drain moved the target to 1 node; `scale 2` lets a newcomer in again
            _, cp = job.cli("scale", "2", "--json")
            out["scale_2"] = cp.returncode
        time.sleep(0.3)
        r2 = job.restarts()

        # 4. b joins again
        t_ev = time.time()
        job.launch("b")
        try:
            first = job.new_world_step(4, t_ev, to)
        except Timeout:
            record("node_join", t_ev, None, timed_out=True)
            return out
        job.steady(first)
        r3 = job.restarts()
        extra = charged(system, r2, r3)
        joined = job.joined_at("b", t_ev) if job.elasticd else None
        if joined is not None:  # b warms its zygote before it registers: the job's own disruption starts here
            extra["from_registration_s"] = round(first.t - joined, 3)
        record("node_join", t_ev, first, extra)

        # 5. b SIGKILLed together with every descendant (its workers)
        victims = tree(job.nodes["b"].proc.pid)
        t_ev = time.time()
        kill_all(victims)
        try:
            first = job.new_world_step(2, t_ev, to)
        except Timeout:
            record("node_kill", t_ev, None, {"killed": len(victims)}, timed_out=True)
            return out
        job.steady(first)
        r4 = job.restarts()
        extra = {"killed": len(victims), **charged(system, r3, r4)}
        lost = job.first_event("node_lost", "b", t_ev) if job.elasticd else None
        if lost is not None:  # which rule noticed it (a closed connection, or missed heartbeats), and when
            extra |= {"lost_reason": lost["reason"], "noticed_s": round(lost["ts"] - t_ev, 3)}
        record("node_kill", t_ev, first, extra)
    except Exception as exc:  # record and go on with the next lifetime
        out["error"] = repr(exc)
        print(f"  [{system} #{rep}] error: {exc!r}", flush=True)
    finally:
        if job.elasticd and job.nodes.get("a") and job.nodes["a"].alive():
            with contextlib.suppress(Exception):
                _, cp = job.cli("events", "--json")
                evs = json.loads(cp.stdout).get("events", [])
                out["rounds"] = [{"ts": e["ts"], "kind": e["kind"], "round": e.get("round"), "cause": e.get("cause"),
                                  "detail": e.get("detail"), "timeline": e.get("timeline"),
                                 "at_step": e.get("at_step"), "op": e.get("op")}
                                 for e in evs if e["kind"] in ("round_started", "round_complete", "first_step",
                                                               "drain_complete", "node_lost", "node_left",
                                                               "command_received", "step_agreed")]
                attach_rounds(out)
        out["loadavg_end"] = os.getloadavg()
        job.stop()
    return out


def attach_rounds(out: dict[str, Any]) -> None:
    """Give each event its elasticd round timelines (round_complete/first_step that fall in its window)."""
    for name, e in out["scenarios"].items():
        if e.get("seconds") is None:
            continue
        lo, hi = e["event_t"] - 0.5, e["event_t"] + e["seconds"] + 0.5
        e["elasticd_rounds"] = [{"kind": r["kind"], "round": r["round"], "cause": r["cause"], "timeline": r["timeline"]}
                                for r in out["rounds"] if r["kind"] in ("round_complete", "first_step")
                                and lo <= r["ts"] <= hi]
        agreed = [r for r in out["rounds"] if r["kind"] == "step_agreed" and lo <= r["ts"] <= hi]
        if agreed:  # shim workers stop at one agreed step (null: no shim step known, plain SIGTERM)
            e["agreed_at_step"] = agreed[0]["at_step"]
        if name == "graceful_leave":
            got = [r["ts"] for r in out["rounds"] if r["kind"] == "command_received" and lo <= r["ts"] <= hi]
            if got:
                e["from_command_received_s"] = round(e["event_t"] + e["seconds"] - got[0], 3)


# -- summary -----------------------------------------------------------------------------------------
def summarize(runs: list[dict[str, Any]], systems: list[str], timeout: float) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for system in systems:
        for sc in SCENARIOS:
            entries = [r["scenarios"][sc] for r in runs if r["system"] == system and sc in r["scenarios"]]
            vals = [e["seconds"] for e in entries if e["seconds"] is not None]
            n_to = sum(1 for e in entries if e["timed_out"])
            lost = [e.get("steps_lost") for e in entries if e.get("steps_lost") is not None]
            redone = [e.get("steps_redone") for e in entries if e.get("steps_redone") is not None]
            charged_ = [e.get("restarts_charged") for e in entries if e.get("restarts_charged") is not None]
            s: dict[str, Any] = {"n": len(entries), "timed_out": n_to,
                                 "median": statistics.median(vals) if vals else None,
                                 "min": min(vals) if vals else None, "max": max(vals) if vals else None,
                                 "steps_lost": lost, "steps_redone": redone, "restarts_charged": charged_}
            if n_to:  # a timeout counts as the timeout in the median: the honest lower bound
                allv = vals + [timeout] * n_to
                s["median"] = statistics.median(allv)
                s["max"] = timeout
                s["median_is_lower_bound"] = True
            if sc == "cold_start":
                anyw = [e["first_step_any_world_s"] for e in entries if e.get("first_step_any_world_s") is not None]
                s["first_any_world_median"] = statistics.median(anyw) if anyw else None
            summary.setdefault(system, {})[sc] = s
    ratios: dict[str, Any] = {}
    for tr in ("torchrun", "torchrun-tuned"):
        for ed in ("elasticd", "elasticd-nozygote", "elasticd-shim"):
            if tr in summary and ed in summary:
                for sc in SCENARIOS:
                    a, b = summary[tr][sc]["median"], summary[ed][sc]["median"]
                    if a is not None and b:
                        ratios.setdefault(f"{tr}/{ed}", {})[sc] = round(a / b, 1)
    return {"summary": summary, "ratios": ratios}


def fmt(s: dict[str, Any]) -> str:
    if s["median"] is None:
        return "—"
    lb = ">" if s.get("median_is_lower_bound") else ""
    text = f"{lb}{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"
    if s["timed_out"]:
        text += f" [{s['timed_out']} timed out]"
    return text


def per_system(result: dict[str, Any], systems: list[str], scenario: str, key: str) -> dict[str, list[Any]]:
    """One recorded extra of a scenario, sorted, per system (lifetimes that did not record it are left out)."""
    found = {s: [r["scenarios"][scenario].get(key) for r in result["runs"]
                 if r["system"] == s and r.get("scenarios", {}).get(scenario)] for s in systems}
    return {s: sorted(v for v in vals if v is not None) for s, vals in found.items()}


def markdown(result: dict[str, Any]) -> str:
    summ, ratios = result["summary"], result["ratios"]
    systems = list(summ)
    n_of = ", ".join(f"{s} {summ[s]['cold_start']['n']}" for s in systems)
    lines = ["### Recovery: seconds from the event to the first step of the new world",
             "", f"median (min-max) over n job lifetimes per system (n: {n_of}); "
             f"step time {result['args']['step_time']} s; timeout {result['args']['timeout']:.0f} s per event.", "",
             "| event | target | " + " | ".join(systems) + " |", "|---|---|" + "---|" * len(systems)]
    for sc in SCENARIOS:
        lines.append(f"| {sc} | ≤ {TARGETS[sc]:g} s | " + " | ".join(fmt(summ[s][sc]) for s in systems) + " |")
    lines.append("| cold start, first step at any world | | " + " | ".join(
        f"{summ[s]['cold_start']['first_any_world_median']:.2f}" if summ[s]["cold_start"].get("first_any_world_median")
        else "—" for s in systems) + " |")
    lines += ["", "Steps lost (last step before the event - resume step) / steps redone (last step of the old "
              "world - resume step) / restarts charged, per lifetime:", "",
              "| event | " + " | ".join(systems) + " |", "|---|" + "---|" * len(systems)]
    for sc in SCENARIOS:
        cells = []
        for s in systems:
            x = summ[s][sc]
            cells.append(f"lost {x['steps_lost']} / redone {x['steps_redone']} / charged {x['restarts_charged']}")
        lines.append(f"| {sc} | " + " | ".join(cells) + " |")
    registered = per_system(result, systems, "node_join", "from_registration_s")
    if any(registered.values()):
        lines += ["", "node_join measured from the newcomer's registration (it registers once its zygote is "
                  "warm; the job keeps training meanwhile): "
                  + "; ".join(f"{s} median {v[len(v) // 2]:.2f} s ({v[0]:.2f}-{v[-1]:.2f})"
                              for s, v in registered.items() if v)]
    noticed = per_system(result, systems, "node_kill", "noticed_s")
    if any(noticed.values()):
        reasons = per_system(result, systems, "node_kill", "lost_reason")
        lines += ["", "node_kill, from the SIGKILL to the coordinator's node_lost: "
                  + "; ".join(f"{s} median {v[len(v) // 2]:.3f} s ({v[0]:.3f}-{v[-1]:.3f}), reasons "
                              f"{sorted(set(reasons[s]))}" for s, v in noticed.items() if v)]
    if ratios:
        keys = list(ratios)
        lines += ["", "### Ratios (torchrun median / elasticd median)", "",
                  "| event | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        for sc in SCENARIOS:
            lines.append(f"| {sc} | " + " | ".join(f"{ratios[k].get(sc, '—')}x" for k in keys) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--repeat-per", default="",
                        help="per-system lifetimes, e.g. torchrun=1,elasticd-nozygote=1 (default: --repeat)")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per event before it counts as timed out")
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--base-tree", default="", help="the checkout that the `-base` systems run")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "recovery.json"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s.removesuffix(BASE) not in SYSTEMS or (s.endswith(BASE) and not s.startswith("elasticd")):
            parser.error(f"unknown system {s}; choose from {SYSTEMS} (an elasticd one may end in {BASE})")
    require_base_tree(parser, systems, args.base_tree)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    logdir = out.parent / "logs"
    logdir.mkdir(exist_ok=True)
    started = time.time()
    runs = []
    # Interleave systems per repetition so slow drift in background load hits all of them alike.
    per = {k: int(v) for k, v in (x.split("=") for x in args.repeat_per.split(",") if x)}
    for rep in range(max([args.repeat, *per.values()])):
        for system in systems:
            if rep >= per.get(system, args.repeat):
                continue
            print(f"== {system} lifetime {rep + 1} (load {os.getloadavg()[0]:.2f})", flush=True)
            runs.append(lifetime(system, rep, args, logdir))
    result = {"args": vars(args), "started": started, "duration_s": round(time.time() - started, 1),
              "python": sys.version.split()[0], "platform": platform.platform(), "runs": runs,
              **summarize(runs, systems, args.timeout)}
    write_report(out, result, markdown)
    print(f"recovery: {result['duration_s']} s; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
