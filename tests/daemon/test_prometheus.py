"""A real Prometheus scrapes a live 2-node job: it sees the world size, and the restart a drain causes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.harness import SHIM_TICKER, Job, free_port
from support.system_deps import require_binary

DEADLINE_S = 60.0


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    return require_binary("prometheus", "prometheus")


class Prometheus:
    """A Prometheus server of our own: a temp config and database, loopback only, scraping every second."""

    def __init__(self, binary: str, tmp: Path, targets: list[str]) -> None:
        config = tmp / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "elasticd", "honor_labels": True,  # keep our `job` label (docs)
                                "static_configs": [{"targets": targets}]}]}))
        self.base = f"http://127.0.0.1:{free_port()}"
        self.log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address={self.base.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> list[float]:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as response:
            return [float(r["value"][1]) for r in json.load(response)["data"]["result"]]

    def wait_for(self, expr: str, want: float) -> None:
        """Poll until `expr` is exactly one series with value `want`: scrapes take a while to land."""
        deadline, seen = time.monotonic() + DEADLINE_S, None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited: {self.output()}"
            try:
                seen = self.query(expr)
            except (urllib.error.URLError, ConnectionError) as exc:  # not listening yet
                seen = repr(exc)
            if seen == [want]:
                return
            time.sleep(0.5)
        raise AssertionError(f"{expr}: wanted [{want}], Prometheus says {seen}; its log:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-3000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    with Job(tmp_path, nnodes="1:2", nproc=1, extra=["--metrics-port", "0", "--preload", "json"]) as job:
        yield job


@pytest.mark.timeout(900)  # the first run may install prometheus
def test_prometheus_sees_the_world_size_and_the_restart_a_drain_causes(
        prometheus_binary: str, job: Job, tmp_path: Path) -> None:
    targets = [job.start(node, SHIM_TICKER).wait_line(r"; metrics http://(\S+)/metrics;").group(1)
               for node in ("a", "b")]
    job.wait_event("round_started", lambda e: e["world_size"] == 2)
    prometheus = Prometheus(prometheus_binary, tmp_path, targets)
    try:
        selector = f'job="{job.job_id}"'
        prometheus.wait_for(f"elasticd_world_size{{{selector}}}", 2)
        prometheus.wait_for(f"count(elasticd_train_step{{{selector}}})", 2)  # a rank on each node: both scraped
        before = job.status()["restarts"]["membership"]  # b may have joined after a's first round: one already
        drain = subprocess.run([sys.executable, "-m", "elasticd.cli", "drain", "b", "--connect",
                                job.daemon("a").control], env=job.env, capture_output=True, text=True, timeout=30)
        assert drain.returncode == 0, drain.stderr
        prometheus.wait_for(f'elasticd_restarts_total{{{selector},cause="membership"}}', before + 1)
        prometheus.wait_for(f'elasticd_node_restarts_total{{{selector},node="a",cause="membership"}}', before + 1)
        prometheus.wait_for(f"elasticd_world_size{{{selector}}}", 1)
        prometheus.wait_for(f'elasticd_nodes{{{selector},role="standby",status="alive"}}', 1)
        prometheus.wait_for(f'sum(elasticd_recovery_seconds_count{{{selector},cause="membership",phase="spawned"}})',
                            before + 1)
        # the drain's round took its first step: both nodes' training up to the drain is accounted, each its own
        prometheus.wait_for(f'count(elasticd_node_time_seconds_total{{{selector},bucket="training"}} > 0)', 2)
        prometheus.wait_for(f'count(elasticd_job_rank_time_seconds_total{{{selector},bucket="training"}} > 0)', 1)
    finally:
        prometheus.stop()


def test_the_alert_rules_in_the_docs_are_rules_prometheus_accepts(prometheus_binary: str, tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    rules = text.split("### Alertmanager rules", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "rules.yml").write_text(rules)
    promtool = Path(prometheus_binary).with_name("promtool")
    checked = subprocess.run([str(promtool), "check", "rules", str(tmp_path / "rules.yml")], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0 and "SUCCESS: 5 rules found" in checked.stdout, checked.stdout + checked.stderr
