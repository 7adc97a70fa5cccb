"""GPU stats per worker from NVML (nvidia-ml-py), read at most once per heartbeat; absent where NVML is not."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Literal, Protocol, TypedDict, TypeVar

import psutil

log = logging.getLogger("elasticd")
ParentOf = Callable[[int], int | None]
ANCESTRY_DEPTH = 6  # a process a worker started (a CUDA subprocess, a loader) is a few forks down at most
T = TypeVar("T")
# The numbers of a worker's record, each null where NVML cannot read it (the exporter makes each a gauge).
GpuReading = Literal["util_percent", "mem_used_bytes", "mem_total_bytes", "temp_c", "power_w", "proc_mem_bytes"]


class GpuDevice(TypedDict):
    """One device's fields, as every worker on it reports them."""

    index: int
    util_percent: int | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    temp_c: int | None
    power_w: float | None


class GpuRecord(GpuDevice):
    """A worker's GPU: its device's fields, and the memory the worker's processes use there."""

    proc_mem_bytes: int | None


class MemoryInfo(Protocol):
    """A device's memory, in bytes (nvmlDeviceGetMemoryInfo)."""

    used: int
    total: int


class Utilization(Protocol):
    """A device's utilisation, in percent (nvmlDeviceGetUtilizationRates)."""

    gpu: int


class GpuProcess(Protocol):
    """A process on a device, and its memory there in bytes (None where the driver does not say)."""

    pid: int
    usedGpuMemory: int | None  # NVML's name


class Nvml(Protocol):
    """The part of pynvml (nvidia-ml-py) the sampler calls; a device handle is NVML's own, only passed back."""

    NVMLError: type[Exception]
    NVML_TEMPERATURE_GPU: int

    def nvmlInit(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object) -> MemoryInfo: ...
    def nvmlDeviceGetPowerUsage(self, handle: object) -> int: ...
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Utilization: ...
    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int: ...


def load_pynvml() -> Nvml:
    import pynvml  # lazily: the first heartbeat pays for it, once

    return pynvml


def parent_pid(pid: int) -> int | None:
    try:
        return int(psutil.Process(pid).ppid())
    except psutil.Error:
        return None


class GpuSampler:
    """All workers' GPU records from one NVML reading per interval; NVML that fails to start is never retried."""

    def __init__(self, interval_s: float, load: Callable[[], Nvml] = load_pynvml, parent_of: ParentOf = parent_pid,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.load, self.parent_of, self.clock = interval_s, load, parent_of, clock
        self.nvml: Nvml | None = None
        self.started: bool | None = None  # None: not tried yet
        self.sampled_at = -math.inf
        self.sampled: tuple[tuple[int, ...], dict[int, GpuRecord | None]] = ((), {})

    def available(self) -> bool:
        """NVML initialised; tried once, at the first call: a node without GPUs says so in one debug line."""
        if self.started is None:
            self.nvml = self.start_nvml()
            self.started = self.nvml is not None
        return self.started

    def start_nvml(self) -> Nvml | None:
        try:
            nvml = self.load()
        except ImportError as exc:
            log.debug("no GPU stats: %s", exc)
            return None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:  # no libnvidia-ml, no driver
            log.debug("no GPU stats: NVML did not start (%s)", exc)
            return None
        return nvml

    def for_workers(self, pids: Sequence[int]) -> dict[int, GpuRecord | None] | None:
        """Each worker pid's GPU record (None: it uses no GPU); None without NVML: no GPU fields at all."""
        nvml = self.nvml if self.available() else None
        if nvml is None:
            return None
        now, key = self.clock(), tuple(sorted(pids))
        # Once per interval, or when the workers changed (a new round): their pids key the reading.
        if now - self.sampled_at >= self.interval_s or key != self.sampled[0]:
            self.sampled_at, self.sampled = now, (key, self.read(nvml, set(key)))
        return dict(self.sampled[1])

    def read(self, nvml: Nvml, pids: set[int]) -> dict[int, GpuRecord | None]:
        records: dict[int, GpuRecord | None] = dict.fromkeys(pids)
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError:
            return records
        best: dict[int, tuple[int, object, int | None]] = {}  # worker -> (device, handle, its memory there)
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                on_device = self.worker_memory(nvml, handle, pids)
            except nvml.NVMLError:
                continue  # this device's processes are unknown: no worker is matched to it
            for worker, used in on_device.items():
                if worker not in best or (used or 0) > (best[worker][2] or 0):
                    best[worker] = (index, handle, used)  # a stray context elsewhere does not win
        devices = {index: self.device(nvml, index, handle) for index, handle, _ in best.values()}
        for worker, (index, _, used) in best.items():
            records[worker] = {**devices[index], "proc_mem_bytes": used}
        return records

    def worker_memory(self, nvml: Nvml, handle: object, pids: set[int]) -> dict[int, int | None]:
        """Each worker's GPU memory on one device: its own processes and its descendants', compute and graphics."""
        by_process: dict[int, int | None] = {}  # pid -> its memory on this device
        for listing in ("ComputeRunningProcesses", "GraphicsRunningProcesses"):
            # The _v3 call where this pynvml has it (a name looked up, so it has no place in Nvml).
            call: Callable[[object], list[GpuProcess]] = \
                getattr(nvml, f"nvmlDeviceGet{listing}_v3", None) or getattr(nvml, f"nvmlDeviceGet{listing}")
            # A process in both lists is counted once; None where the driver does not say (NVML_VALUE_NOT_AVAILABLE).
            by_process.update({int(proc.pid): proc.usedGpuMemory for proc in call(handle)})
        used: dict[int, int | None] = {}
        for pid, memory in by_process.items():
            worker = self.worker_of(pid, pids)
            if worker is not None:
                known = [m for m in (used.get(worker), memory) if m is not None]
                used[worker] = sum(known) if known else None
        return used

    def worker_of(self, pid: int, pids: set[int]) -> int | None:
        """The worker that is this process or its ancestor; only GPU processes are looked up, so it stays cheap."""
        for _ in range(ANCESTRY_DEPTH):
            if pid in pids:
                return pid
            parent = self.parent_of(pid)
            if parent is None or parent <= 1:
                return None
            pid = parent
        return None

    def device(self, nvml: Nvml, index: int, handle: object) -> GpuDevice:
        """Device-wide fields; one that NVML cannot read (unsupported, an error) is null, the others stay."""
        def field(read: Callable[[], T]) -> T | None:
            try:
                return read()
            except nvml.NVMLError:
                return None

        memory = field(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        power_mw = field(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        return {"index": index, "util_percent": field(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                "mem_used_bytes": None if memory is None else int(memory.used),
                "mem_total_bytes": None if memory is None else int(memory.total),
                "temp_c": field(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                "power_w": None if power_mw is None else round(power_mw / 1000, 1)}
