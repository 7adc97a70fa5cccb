"""`elasticd start --metrics-port`: every family docs/metrics.md lists is served, with its type and labels."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.harness import ROOT, SHIM_TICKER, Job

from elasticd.client import Credentials
from elasticd.daemon.exporter import DaemonCollector
from elasticd.job.config import JobConfig
from elasticd.keys.auth import KeyStore
from elasticd.member.agent import NodeAgent

NVML_ONLY = "elasticd_gpu_"  # served only where NVML is present (not on this machine): see test_gpu_families
DOC_ROW = re.compile(r"^\| `(elasticd_\w+)` \| (\w+) \| ([^|]+) \|", re.MULTILINE)


def documented() -> dict[str, tuple[str, set[str]]]:
    """docs/metrics.md's tables: family name (as the parser names it) -> (type, labels)."""
    rows = DOC_ROW.findall((ROOT / "docs" / "metrics.md").read_text())
    return {name.removesuffix("_total") if kind == "counter" else name: (kind, set(re.findall(r"`(\w+)`", labels)))
            for name, kind, labels in rows}


def scrape(url: str) -> dict[str, tuple[str, set[str], dict[tuple[tuple[str, str], ...], float]]]:
    """Our families: name -> (type, label names, {sorted labels of a sample (its name too): value})."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("elasticd_"):
            labels = {k for s in family.samples for k in s.labels if k != "le"}
            values = {tuple(sorted({**s.labels, "__name__": s.name}.items())): s.value for s in family.samples}
            found[family.name] = (family.type, labels, values)
    return found


def scrape_until(url: str, done: Callable[[dict], bool], timeout: float = 30.0) -> dict:  # type: ignore[type-arg]
    """Scrapes until `done` holds of one or the time is up: the last scrape either way (the asserts say why)."""
    deadline = time.monotonic() + timeout
    while not done(served := scrape(url)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return served


def value(families: dict, name: str, **labels: str) -> float | None:  # type: ignore[type-arg]
    """The value of the first sample of `name` (a family, or a histogram's `_count` and such) with these labels."""
    family = re.sub(r"_(total|count|sum|bucket)$", "", name)
    for key, found in families.get(family, families.get(name, ("", set(), {})))[2].items():
        sample = dict(key)
        if sample["__name__"] == name and labels.items() <= sample.items():
            return found
    return None


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Job, str]]:
    """One keyed node (so the refusal counter is there too) with two shim ranks, after an operator restart."""
    tmp = tmp_path_factory.mktemp("metrics")
    store = KeyStore(tmp / "keys")
    store.init()
    ops = store.create_client("ops", "operator")
    with Job(tmp, nnodes="1:1", nproc=2, extra=["--keys", str(store.root), "--metrics-port", "0"]) as job:
        job.credentials = Credentials.load(str(ops), str(store.node_dir / "node.key"))
        daemon = job.start("a", SHIM_TICKER)
        url = daemon.wait_line(r"; metrics (http://\S+);").group(1)
        job.wait_event("first_step")
        with job.client() as client:
            client.call("restart")
        job.wait_event("first_step", lambda e: e["round"] == 2)
        yield job, url


def test_metrics_port_0_picks_a_free_port_and_prints_it(job: tuple[Job, str]) -> None:
    _job, url = job
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url) and not url.endswith(":0/metrics")


def test_every_documented_family_is_served_with_its_type_and_labels(job: tuple[Job, str]) -> None:
    _job, url = job
    docs = documented()
    assert len(docs) >= 18  # both tables were read
    def missing(served: dict) -> list[str]:  # type: ignore[type-arg]
        return sorted(n for n in docs.keys() - served.keys() if not n.startswith(NVML_ONLY))
    served = scrape_until(url, lambda s: not missing(s))  # the new round's first checkpoint report may be on its way
    assert missing(served) == []
    assert sorted(served.keys() - docs.keys()) == [], "served but not in docs/metrics.md"
    for name, (kind, labels) in docs.items():
        if name in served:
            assert (served[name][0], served[name][1]) == (kind, labels), name


def ranks_reported(served: dict) -> bool:  # type: ignore[type-arg]
    """Both ranks' telemetry and worker records are in: they ride the node's heartbeat, up to 1 s after first_step."""
    return value(served, "elasticd_workers", status="running") == 2 and all(
        value(served, name, rank=rank) is not None
        for name in ("elasticd_train_step", "elasticd_train_loss", "elasticd_worker_resident_memory_bytes")
        for rank in ("0", "1"))


def test_the_values_are_the_daemons(job: tuple[Job, str]) -> None:
    the_job, url = job
    served = scrape_until(url, ranks_reported)
    assert value(served, "elasticd_world_size") == 2
    assert value(served, "elasticd_round") == 2
    assert value(served, "elasticd_job_state", status="running") == 1
    assert value(served, "elasticd_nodes", role="active", status="alive") == 1
    assert value(served, "elasticd_node_healthy", node="a") == 1 and value(served, "elasticd_spares") == 0
    assert value(served, "elasticd_restarts_total", job=the_job.job_id, cause="operator") == 1
    assert value(served, "elasticd_node_restarts_total", node="a", cause="operator") == 1
    assert value(served, "elasticd_workers", status="running") == 2
    assert value(served, "elasticd_recovery_seconds_count", cause="operator", phase="spawned") == 1
    assert value(served, "elasticd_refused_keys_total") == 0
    assert (value(served, "elasticd_train_step", rank="1") or 0) >= 1
    assert 0 < (value(served, "elasticd_train_loss", rank="0") or 0) <= 1
    assert (value(served, "elasticd_worker_resident_memory_bytes", rank="0") or 0) > 1e6


class BrokenCoordinator:
    """A coordinator whose every read fails, as a bug in the job section would."""

    def status(self, now: float) -> dict[str, object]:
        raise RuntimeError("a bug in status")

    def clock(self) -> float:
        return time.time()


@pytest.mark.asyncio
async def test_a_failing_section_is_logged_and_the_rest_is_still_served(caplog: pytest.LogCaptureFixture) -> None:
    cfg = JobConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, rdzv_host="127.0.0.1", rdzv_port=1, job_id="j",
                    node_id="a", entry=["x.py"])
    host = SimpleNamespace(cfg=cfg, node=NodeAgent(cfg, "127.0.0.1", lambda *_: None, lambda *_, **__: None, {}),
                           gate=None, coordinator=BrokenCoordinator())
    collector = DaemonCollector(host, asyncio.get_running_loop())  # type: ignore[arg-type]
    names = {m.name for m in await asyncio.to_thread(lambda: list(collector.collect()))}  # a scrape thread's call
    assert {"elasticd_node_state", "elasticd_workers", "elasticd_node_restarts"} <= names
    assert not names & {"elasticd_world_size", "elasticd_job_state"}
    assert "metrics: job_metrics failed; the scrape returns the rest" in caplog.text


class FakeGpus:
    """NVML's answer for one worker on GPU 1 (elasticd/member/gpu.py GpuSampler.for_workers)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def for_workers(self, pids: list[int]) -> dict[int, dict[str, float] | None]:
        return {pid: {"index": 1, "util_percent": 50.0, "mem_used_bytes": 2e9, "mem_total_bytes": 8e9,
                      "proc_mem_bytes": 1e9, "temp_c": 61.0, "power_w": 180.0} if pid == self.pid else None
                for pid in pids}


@pytest.mark.asyncio
async def test_gpu_families_carry_nvmls_view_of_each_worker_in_base_units() -> None:
    cfg = JobConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_host="127.0.0.1", rdzv_port=1, job_id="j",
                    node_id="a", entry=["x.py"])
    node = NodeAgent(cfg, "127.0.0.1", lambda *_: None, lambda *_, **__: None, {})
    on_gpu, off_gpu = (SimpleNamespace(pid=pid, rank=rank, exit_code=None, ps=None, status="running",
                                       proc=SimpleNamespace(pid=pid)) for pid, rank in ((101, 0), (102, 1)))
    node.group = SimpleNamespace(workers=[on_gpu, off_gpu])  # type: ignore[assignment]
    node.gpu = FakeGpus(101)  # type: ignore[assignment]
    host = SimpleNamespace(cfg=cfg, node=node, gate=None, coordinator=None)
    collector = DaemonCollector(host, asyncio.get_running_loop())  # type: ignore[arg-type]
    metrics = {m.name: m for m in await asyncio.to_thread(lambda: list(collector.collect()))}
    docs = {n for n in documented() if n.startswith(NVML_ONLY)}
    assert docs and docs <= metrics.keys()
    for name in docs:
        sample, = metrics[name].samples  # rank 1 is on no GPU: no sample
        assert (sample.labels["rank"], sample.labels["gpu"]) == ("0", "1")
    assert metrics["elasticd_gpu_utilization_ratio"].samples[0].value == 0.5
    assert metrics["elasticd_gpu_memory_total_bytes"].samples[0].value == 8e9
