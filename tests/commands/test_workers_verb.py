"""`elasticd workers`: a line per worker; the GPU columns only when the daemons report GPU fields (NVML)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.harness import TICKER, Job

from elasticd.commands.registry import REGISTRY
from elasticd.commands.verbs.workers import render
from elasticd.member.gpu import GpuSampler

GIB = 1 << 30
WORKER = {"pid": 4242, "local_rank": 0, "rank": 0, "state": "running", "exit_code": None, "cpu_percent": 38.2,
          "rss": 300 * 1024 * 1024, "uptime_s": 13.1, "log": "/tmp/rank-0.log", "round": 1}
GPU = {"index": 1, "util_percent": 87, "mem_used_bytes": 40 * GIB, "mem_total_bytes": 80 * GIB, "temp_c": 64,
       "power_w": 301.5, "proc_mem_bytes": 12 * GIB}


def workers(job: Job, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "elasticd.cli", "workers", *args], env=job.env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_render_shows_gpu_columns_only_when_reported() -> None:
    answer = REGISTRY["workers"].answer  # the reply's record, decoded as the CLI decodes it
    plain = render(answer({"ok": True, "nodes": {"a": [WORKER]}})).splitlines()
    assert plain[0].split() == ["NODE", "RANK", "LOCAL", "PID", "STATE", "EXIT", "CPU%", "RSS", "UPTIME"]
    assert plain[1].split() == ["a", "0", "0", "4242", "running", "-", "38", "300.0M", "13s"]
    on_gpu = render(answer({"ok": True, "nodes": {"a": [{**WORKER, "gpu": GPU}, {**WORKER, "rank": 1, "gpu": None}]}}
                           )).splitlines()
    assert on_gpu[0].split()[9:] == ["GPU", "UTIL%", "GPU", "MEM", "DEV", "MEM", "TEMP", "POWER"]
    assert on_gpu[1].split()[9:] == ["1", "87", "12.0G", "40.0G/80.0G", "64C", "302W"]
    assert on_gpu[2].split()[9:] == ["-"] * 6  # NVML is there, this worker is on no GPU


@pytest.mark.skipif(GpuSampler(1.0).available(), reason="this host has NVML: workers carry GPU fields")
def test_without_nvml_the_records_and_the_table_have_no_gpu(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1", nproc=2) as job:
        job.start("a", TICKER)
        job.wait_event("workers_started")
        deadline, records = time.monotonic() + 20, []
        while len(records) < 2 and time.monotonic() < deadline:  # the first heartbeat with workers, ≤ 1 s
            records = json.loads(workers(job, "--json"))["nodes"].get("a", [])
            time.sleep(0.2)
        assert len(records) == 2 and all("gpu" not in r for r in records)
        table = workers(job)
        header: list[Any] = table.splitlines()[0].split()
        assert header[:4] == ["NODE", "RANK", "LOCAL", "PID"] and not {"GPU", "UTIL%", "POWER"} & set(header)
        output = job.daemon().output()
        assert "NVML" not in output and "GPU" not in output  # at most a debug line, and the daemon logs no debug
