"""Human-readable text shared by the verbs' renderers; `--json` bypasses it."""

from __future__ import annotations

import json
import time
from typing import Any


def plain(result: dict[str, Any]) -> str:
    """Any reply: a steering verb's plan in one line, anything else as indented JSON."""
    if "plan" in result:
        plan = result["plan"]
        head = "dry run: " if result.get("dry_run") else ("accepted: " if result.get("accepted") else "")
        op_id = f" (op {result['op_id']})" if result.get("op_id") else ""
        return f"{head}{plan.get('summary', '')}{op_id}"
    return json.dumps({k: v for k, v in result.items() if k != "ok"}, indent=1)


def format_bytes(count: float | None) -> str:
    """Bytes in binary units: 512B, 3.1M, 1.2G."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "K", "M", "G", "T"):
        if value < 1024 or unit == "T":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}T"


GPU_COLUMNS = ("gpu", "util%", "gpu mem", "dev mem", "temp", "power")


def has_gpu(workers: list[dict[str, Any]]) -> bool:
    """Whether the records carry GPU fields at all (their daemon has NVML), so the GPU columns are shown."""
    return any("gpu" in w for w in workers)


def gpu_cells(gpu: dict[str, Any] | None) -> list[str]:
    """A worker's GPU record under GPU_COLUMNS: the worker's memory; the device's use, memory, heat and power."""
    if not gpu:
        return ["-"] * len(GPU_COLUMNS)

    def known(key: str, text: str) -> str:
        return "-" if gpu.get(key) is None else text.format(gpu[key])

    dev_mem = "-" if gpu.get("mem_used_bytes") is None else \
        f"{format_bytes(gpu['mem_used_bytes'])}/{format_bytes(gpu.get('mem_total_bytes'))}"
    return [str(gpu.get("index")), known("util_percent", "{:.0f}"), format_bytes(gpu.get("proc_mem_bytes")),
            dev_mem, known("temp_c", "{:.0f}C"), known("power_w", "{:.0f}W")]


def event(e: dict[str, Any]) -> str:
    """One job event on one line, as `events` prints it and `events --follow` streams it."""
    stamp = time.strftime("%H:%M:%S", time.localtime(float(e.get("ts", 0))))
    skip = {"seq", "ts", "kind", "node"}
    details = " ".join(f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}"
                       for k, v in e.items() if k not in skip)
    return f"{stamp} #{e.get('seq')} [{e.get('node')}] {e.get('kind')} {details}".rstrip()
