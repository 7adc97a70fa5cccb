"""Prometheus metrics (`elasticd start --metrics-port`): one collector that reads the daemon's live state per scrape."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol, TypeGuard

import psutil
from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.round_progress import timeline
from elasticd.job.config import JobConfig, StartError
from elasticd.keys.auth import Gatekeeper
from elasticd.member.agent import NodeAgent
from elasticd.member.gpu import GpuReading
from elasticd.member.processes.workers import Worker
from elasticd.wire.names import RESTART_CAUSES, JobState, NodeState, NodeStatus, Role

log = logging.getLogger("elasticd")
SCRAPE_TIMEOUT_S = 5.0  # a daemon loop busy this long gets an empty scrape (logged) rather than a stuck scraper
RECOVERY_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
WORKER_STATUSES = ("running", "succeeded", "failed")  # Worker.status
Family = type[GaugeMetricFamily] | type[CounterMetricFamily]


class MetricsHost(Protocol):
    """What the exporter reads of its daemon, and nothing more."""

    cfg: JobConfig
    node: NodeAgent
    gate: Gatekeeper | None

    @property
    def coordinator(self) -> Coordinator | None: ...


class Families:
    """Metric families built sample by sample; every sample carries the same base labels (job, node)."""

    def __init__(self, **base: str) -> None:
        self.base = base
        self.built: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def add(self, kind: Family, name: str, doc: str, value: float, **labels: str) -> None:
        family = self.built.get(name)
        if family is None:
            family = self.built[name] = kind(name, doc, labels=[*self.base, *labels])
        family.add_metric([*self.base.values(), *labels.values()], value)

    def gauge(self, name: str, doc: str, value: float, **labels: str) -> None:
        self.add(GaugeMetricFamily, name, doc, value, **labels)

    def counter(self, name: str, doc: str, value: float, **labels: str) -> None:
        self.add(CounterMetricFamily, name, doc, value, **labels)

    def one_of(self, name: str, doc: str, current: str, values: Iterable[str]) -> None:
        """An enum as gauges: 1 for the current value of the `status` label, 0 for every other."""
        for value in values:
            self.gauge(name, doc, float(value == current), status=value)


class DaemonCollector(Collector):
    """Reads the node (and, on the coordinator's daemon, the job) on the daemon's own loop at each scrape."""

    def __init__(self, host: MetricsHost, loop: asyncio.AbstractEventLoop) -> None:
        self.host = host
        self.loop = loop
        self.recovery = Histogram("elasticd_recovery_seconds", "Seconds from detecting a restart's cause to each "
                                  "phase of the round that recovered from it", ["job", "cause", "phase"],
                                  registry=None, buckets=RECOVERY_BUCKETS_S)
        self.observed: dict[int, set[str]] = {}  # round id -> phases already in the histogram

    def collect(self) -> Iterable[Metric]:
        """On the scrape thread: the state is the loop's, so it is read there (never torn mid-update)."""
        future = None
        try:
            future = asyncio.run_coroutine_threadsafe(self._read(), self.loop)
            return future.result(SCRAPE_TIMEOUT_S)
        except Exception as exc:  # a stuck or closing loop: an empty scrape, never an exception in the server
            if future is not None:
                future.cancel()
            log.warning("metrics: the daemon's loop did not answer a scrape within %.0fs (busy or closing): %r",
                        SCRAPE_TIMEOUT_S, exc)
            return []

    async def _read(self) -> list[Metric]:
        found: list[Metric] = []
        sections: list[Callable[[], list[Metric]]] = [self.node_metrics]
        if self.host.coordinator is not None:
            sections.append(self.job_metrics)
        for section in sections:
            try:
                found += section()
            except Exception:  # a bug in one section must not cost the others (nor the daemon)
                log.exception("metrics: %s failed; the scrape returns the rest", section.__name__)
        return found

    # ---- every daemon: this node, its workers and their shim reports ----------------------------
    def node_metrics(self) -> list[Metric]:
        cfg, node = self.host.cfg, self.host.node
        out = Families(job=cfg.job_id, node=cfg.node_id)
        out.one_of("elasticd_node_state", "This node's agent state (1 for the current one)", node.state, NodeState)
        workers = node.group.workers if node.group else []
        states = [w.status for w in workers]  # not info(): its cpu_percent would reset `elasticd workers`' baseline
        for status in WORKER_STATUSES:
            out.gauge("elasticd_workers", "Local worker processes of the current round by status",
                      states.count(status), status=status)
        restarts = node.assignment.node_restarts
        for cause in RESTART_CAUSES:
            out.counter("elasticd_node_restarts_total", "Rounds that restarted this node's workers, by cause",
                        int(restarts.get(cause, 0)), cause=cause)
        for worker in workers:
            if worker.exit_code is None and worker.ps is not None:
                with contextlib.suppress(psutil.Error), worker.ps.oneshot():
                    cpu, rss = worker.ps.cpu_times(), worker.ps.memory_info().rss
                    rank = str(worker.rank)
                    out.counter("elasticd_worker_cpu_seconds_total", "CPU seconds (user + system) of the worker "
                                "process", cpu.user + cpu.system, rank=rank)
                    out.gauge("elasticd_worker_resident_memory_bytes", "Resident memory of the worker process",
                              rss, rank=rank)
        self.gpu_metrics(out, workers)
        self.shim_metrics(out)
        if self.host.gate is not None:
            out.counter("elasticd_refused_keys_total", "Connections this daemon's keyed sockets refused",
                        self.host.gate.refusals.total)
        return list(out.built.values())

    def gpu_metrics(self, out: Families, workers: list[Worker]) -> None:
        """NVML's view of each running worker's GPU (elasticd/member/gpu.py; nothing without NVML)."""
        running = {w.proc.pid: str(w.rank) for w in workers if w.exit_code is None}
        by_pid = self.host.node.gpu.for_workers(list(running)) if running else None
        for pid, gpu in (by_pid or {}).items():
            if gpu is None:
                continue
            labels = {"rank": running[pid], "gpu": str(gpu["index"])}
            for name, key, scale, doc in GPU_GAUGES:
                value = gpu[key]
                if _is_number(value):
                    out.gauge(name, doc, value * scale, **labels)

    def shim_metrics(self, out: Families) -> None:
        """What trainer_shim ranks of the current round reported (`elasticd metrics` shows the same)."""
        node, now = self.host.node, time.time()
        for m in node.rank_reports.of_round(node.round_id):
            rank = str(m.get("rank"))
            for name, key, doc in (("elasticd_train_step", "step", "The rank's last reported step"),
                                   ("elasticd_train_loss", "loss", "The rank's last reported loss"),
                                   ("elasticd_train_samples_per_second", "throughput",
                                    "Samples per second between the rank's last two step reports")):
                value = m.get(key)
                if _is_number(value):
                    out.gauge(name, doc, value, rank=rank)
            out.gauge("elasticd_train_step_age_seconds", "Seconds since the rank's last step report (or its hello)",
                      now - m.get("last_step_at", now), rank=rank)
            saved = m.get("last_checkpoint")
            saved_at = saved["at"] if saved else None
            if isinstance(saved_at, float):
                out.gauge("elasticd_checkpoint_age_seconds", "Seconds since the rank's last checkpoint this round",
                          now - saved_at, rank=rank)

    # ---- the coordinator's daemon only: the job -----------------------------------------------------
    def job_metrics(self) -> list[Metric]:
        c = self.host.coordinator
        assert c is not None
        status = c.status(c.clock())
        out = Families(job=c.cfg.job_id)
        out.one_of("elasticd_job_state", "The job's state (1 for the current one)", status["state"], JobState)
        out.gauge("elasticd_round", "The current round (membership epoch)", status["round"])
        out.gauge("elasticd_world_size", "Worker processes (ranks) in the current round", status["world_size"])
        out.gauge("elasticd_target_nodes", "Nodes the job aims to run on (scale sets it)", status["target"])
        nodes = [(n["role"], n["status"]) for n in status["nodes"]]
        for role in Role:
            for node_status in NodeStatus:
                out.gauge("elasticd_nodes", "Nodes known to the coordinator by role and status",
                          nodes.count((role, node_status)), role=role, status=node_status)
        for cause, count in status["restarts"].items():
            out.counter("elasticd_restarts_total", "Rounds started to restart the job, by cause", count, cause=cause)
        for node in status["nodes"]:  # docs/health.md: a failing check or a lemon; the reasons are in `status`
            if node["status"] == NodeStatus.alive:
                out.gauge("elasticd_node_healthy", "1 while the node's last health verdict passed, 0 while it failed",
                          0 if node.get("health") else 1, node=node["node_id"])
        out.gauge("elasticd_spares", "Standby nodes ready to take the place of a node that goes",
                  status["spares"]["ready"])
        self.goodput_metrics(out, c, status["goodput"])
        self.observe_recoveries(c)
        return [*out.built.values(), *self.recovery.collect()]

    def goodput_metrics(self, out: Families, c: Coordinator, share: float | None) -> None:
        """Time by bucket as counters of closed stretches (they only grow: rate() gives any window's share)."""
        def by_bucket(name: str, doc: str, totals: dict[str, float], **labels: str) -> None:
            for bucket, seconds in totals.items():  # `recovery.crash`: bucket recovery, reason crash
                kind, _, reason = bucket.partition(".")
                out.counter(name, doc, seconds, **labels, bucket=kind, reason=reason)

        by_bucket("elasticd_job_time_seconds_total", "The job's wall time by bucket (recovery by reason), accounted "
                  "at each round's first step", c.goodput.totals)
        by_bucket("elasticd_job_rank_time_seconds_total", "Rank-seconds by bucket: wall time times the round's ranks; "
                  "training over all of it is goodput", c.goodput.rank_totals)
        for node_id, buckets in c.goodput.nodes.totals.items():
            by_bucket("elasticd_node_time_seconds_total", "A node's own time in the job by bucket: the job's while it "
                      "held ranks, idle while it held none", buckets, node=node_id)
        for node_id in c.round.node_ids() if c.round else []:
            figures = c.stragglers.named.get(node_id, {})
            out.gauge("elasticd_straggler_cost_seconds", "Seconds per step the other ranks wait for this node while "
                      "it is named a straggler (0 otherwise)", float(figures.get("cost_s_per_step", 0.0)), node=node_id)
        if share is not None:
            out.gauge("elasticd_goodput_ratio", "Share of the job's rank time that trained, over its life", share)

    def observe_recoveries(self, c: Coordinator) -> None:
        """Each phase of each completed restart round enters the histogram once (rounds are kept in the store)."""
        rounds = c.store.rounds()
        kept = {r.round_id for r in rounds}
        self.observed = {k: v for k, v in self.observed.items() if k in kept}
        for rnd in rounds:
            if rnd.cause not in RESTART_CAUSES or "spawned" not in rnd.timeline:
                continue  # the first round recovers from nothing; an unfinished one has not recovered yet
            seen = self.observed.setdefault(rnd.round_id, set())
            for phase, seconds in timeline(rnd).items():
                if phase != "detect" and phase not in seen:
                    seen.add(phase)
                    self.recovery.labels(c.cfg.job_id, rnd.cause, phase).observe(seconds)


GPU_GAUGES: tuple[tuple[str, GpuReading, float, str], ...] = (  # (metric, worker-record key, scale to base units, help)
    ("elasticd_gpu_utilization_ratio", "util_percent", 0.01, "Utilisation of the worker's GPU (0-1)"),
    ("elasticd_gpu_memory_used_bytes", "mem_used_bytes", 1, "Memory used on the worker's GPU, all processes"),
    ("elasticd_gpu_memory_total_bytes", "mem_total_bytes", 1, "Memory of the worker's GPU"),
    ("elasticd_gpu_process_memory_bytes", "proc_mem_bytes", 1, "GPU memory the worker process itself uses"),
    ("elasticd_gpu_temperature_celsius", "temp_c", 1, "Temperature of the worker's GPU"),
    ("elasticd_gpu_power_watts", "power_w", 1, "Power draw of the worker's GPU"),
)


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


class MetricsExporter:
    """The scrape endpoint: prometheus_client's HTTP server on its own thread, serving one registry."""

    def __init__(self, host: MetricsHost, bind_host: str, port: int) -> None:
        disable_created_metrics()  # no `_created` series beside the histogram: the text format has no use for it
        self.registry = CollectorRegistry(auto_describe=False)  # describing would collect: not from the loop
        self.registry.register(DaemonCollector(host, asyncio.get_running_loop()))
        ProcessCollector(registry=self.registry)  # the daemon's own process_cpu_seconds_total and memory
        try:
            self.server, _thread = start_http_server(port, bind_host, registry=self.registry)
        except OSError as exc:
            reason = "address in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
            raise StartError(f"cannot bind --metrics-port {port} on {bind_host}: {reason}") from None
        self.url = f"http://{_url_host(bind_host)}:{self.server.server_port}/metrics"

    def close(self) -> None:
        """Stop serving without making the daemon wait out the server's half-second poll."""
        threading.Thread(target=self._stop, daemon=True).start()

    def _stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def bind_host_of(control_endpoint: str) -> str:
    """Where the scrape endpoint listens: the control socket's host (an ipc:// control means loopback)."""
    if not control_endpoint.startswith("tcp://"):
        return "127.0.0.1"
    host = control_endpoint[len("tcp://"):].rpartition(":")[0].strip("[]")
    return "0.0.0.0" if host in ("*", "") else host


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
