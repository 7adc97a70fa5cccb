"""Human-readable text shared by the verbs' renderers; `--json` bypasses it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

ELLIPSIS = "…"
PATH_WIDTH = 40


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


def significant(value: float, digits: int = 3) -> str:
    """0.049312345 -> 0.0493, 0.8 -> 0.800, 1234.5 -> 1234 (no exponent for the sizes events carry)."""
    if value == 0 or abs(value) >= 10 ** (digits - 1):
        return f"{value:.0f}"
    if abs(value) < 1e-4:
        return f"{value:.{digits - 1}e}"
    return f"{value:#.{digits}g}".rstrip(".")  # '#' keeps the zeros of 0.800; 99.96 gives '100.'


def format_seconds(value: float | None) -> str:
    return "-" if value is None else f"{significant(float(value))} s"


def span(ranks: list[int]) -> str:
    """0-3 for a contiguous run, else 0,2,5."""
    if not ranks:
        return "-"
    contiguous = ranks[-1] - ranks[0] == len(ranks) - 1
    return f"{ranks[0]}-{ranks[-1]}" if contiguous and len(ranks) > 1 else ",".join(map(str, ranks))


def short_path(path: str, width: int = PATH_WIDTH) -> str:
    """The file name and as many parent folders as fit: `…/step-200/rank-3.pt`; a long file name keeps its end."""
    if len(path) <= width:
        return path
    parts = path.split("/")
    tail = parts[-1]
    for part in reversed(parts[:-1]):
        if len(part) + 1 + len(tail) + 2 > width:  # room for "…/" in front
            break
        tail = f"{part}/{tail}"
    if len(tail) + 2 > width:  # the file name alone is too long: keep its end (extension, step, rank)
        return ELLIPSIS + tail[len(tail) - width + 1:]
    return f"{ELLIPSIS}/{tail}"


GPU_COLUMNS = ("gpu", "util%", "gpu mem", "dev mem", "temp", "power")


def has_gpu(workers: Sequence[Mapping[str, object]]) -> bool:
    """Whether the records carry GPU fields at all (their daemon has NVML), so the GPU columns are shown."""
    return any("gpu" in w for w in workers)


def gpu_cells(gpu: Mapping[str, Any] | None) -> list[str]:
    """A worker's GPU record under GPU_COLUMNS: the worker's memory; the device's use, memory, heat and power."""
    if not gpu:
        return ["-"] * len(GPU_COLUMNS)

    def known(key: str, text: str) -> str:
        return "-" if gpu.get(key) is None else text.format(gpu[key])

    dev_mem = "-" if gpu.get("mem_used_bytes") is None else \
        f"{format_bytes(gpu['mem_used_bytes'])}/{format_bytes(gpu.get('mem_total_bytes'))}"
    return [str(gpu.get("index")), known("util_percent", "{:.0f}"), format_bytes(gpu.get("proc_mem_bytes")),
            dev_mem, known("temp_c", "{:.0f}C"), known("power_w", "{:.0f}W")]

