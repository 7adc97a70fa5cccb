"""GPU stats per worker (elasticd/member/gpu.py) against a stand-in for pynvml: mapping, errors, caching, no NVML."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from elasticd.job.config import JobConfig
from elasticd.member.agent import NodeAgent
from elasticd.member.gpu import GpuSampler

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

GIB = 1 << 30


class NVMLError(Exception):
    pass


@dataclass
class FakeDevice:
    compute: dict[int, int | None]  # pid -> used GPU memory
    graphics: dict[int, int | None] = field(default_factory=dict)
    util: int = 50
    used: int = 10 * GIB
    total: int = 80 * GIB
    temp: int = 60
    power_mw: int = 250_000
    failing: set[str] = field(default_factory=set)  # NVML functions that raise NVMLError on this device


class FakeNvml:
    """The slice of pynvml the sampler calls; handles are device indexes. Counts every call."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, devices: list[FakeDevice], init_error: bool = False) -> None:
        self.devices, self.init_error, self.calls, self.count_error = devices, init_error, 0, False

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml"):
            object.__setattr__(self, "calls", object.__getattribute__(self, "calls") + 1)
        return object.__getattribute__(self, name)

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error:
            raise NVMLError("GPU is lost")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def check(self, handle: int, name: str) -> FakeDevice:
        device = self.devices[handle]
        if name in device.failing:
            raise NVMLError(f"{name} failed")
        return device

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: int) -> list[Any]:
        device = self.check(handle, "processes")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in device.compute.items()]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Any]:  # no _v3: the plain one is used
        device = self.check(handle, "processes")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in device.graphics.items()]

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=self.check(handle, "util").util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        device = self.check(handle, "memory")
        return SimpleNamespace(used=device.used, total=device.total, free=device.total - device.used)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return self.check(handle, "temp").temp

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self.check(handle, "power").power_mw


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


PARENTS = {500: 101, 501: 500}  # 501 is a grandchild of worker 101 (a CUDA subprocess of a subprocess)


def two_gpus() -> FakeNvml:
    """101 on device 0 (its grandchild 501 on 1, less), 102 on 1, 103 mostly on 2 (stray on 1); 900 no worker."""
    return FakeNvml([
        FakeDevice(compute={101: 4 * GIB, 900: GIB}, graphics={101: 4 * GIB}, util=87, temp=64, power_mw=301_500),
        FakeDevice(compute={102: 6 * GIB, 501: GIB, 103: 1000}, util=12, used=7 * GIB),
        FakeDevice(compute={103: 3 * GIB}),
    ])


def sampler(nvml: FakeNvml, clock: Clock | None = None) -> GpuSampler:
    return GpuSampler(1.0, load=lambda: nvml, parent_of=PARENTS.get, clock=clock or Clock())


def test_each_worker_gets_its_device_and_its_own_memory() -> None:
    records = sampler(two_gpus()).for_workers([101, 102, 103, 104])
    assert records == {
        101: {"index": 0, "util_percent": 87, "mem_used_bytes": 10 * GIB, "mem_total_bytes": 80 * GIB,
              "temp_c": 64, "power_w": 301.5, "proc_mem_bytes": 4 * GIB},  # in both lists: counted once
        102: {"index": 1, "util_percent": 12, "mem_used_bytes": 7 * GIB, "mem_total_bytes": 80 * GIB,
              "temp_c": 60, "power_w": 250.0, "proc_mem_bytes": 6 * GIB},
        103: {"index": 2, "util_percent": 50, "mem_used_bytes": 10 * GIB, "mem_total_bytes": 80 * GIB,
              "temp_c": 60, "power_w": 250.0, "proc_mem_bytes": 3 * GIB},  # where most of its memory is
        104: None,  # on no GPU
    }


def test_a_workers_descendants_count_as_the_worker() -> None:
    records = sampler(two_gpus()).for_workers([101, 500])  # 500 is a worker now; its child 501 is on device 1
    assert records is not None and records[500] is not None
    assert records[500]["index"] == 1 and records[500]["proc_mem_bytes"] == GIB


def test_memory_the_driver_does_not_report_is_null_not_zero() -> None:
    nvml = FakeNvml([FakeDevice(compute={101: None})])
    records = sampler(nvml).for_workers([101])
    assert records is not None and records[101] is not None
    assert records[101]["index"] == 0 and records[101]["proc_mem_bytes"] is None


def test_a_failing_call_nulls_its_field_and_a_device_without_processes_is_skipped() -> None:
    nvml = two_gpus()
    nvml.devices[0].failing = {"power", "temp"}
    nvml.devices[1].failing = {"processes"}
    records = sampler(nvml).for_workers([101, 102, 103])
    assert records is not None and records[101] is not None and records[103] is not None
    assert records[101]["power_w"] is None and records[101]["temp_c"] is None
    assert records[101]["util_percent"] == 87 and records[101]["proc_mem_bytes"] == 4 * GIB
    assert records[102] is None  # device 1's process list failed: nobody is matched there
    assert records[103]["index"] == 2  # the other devices are still reported


def test_device_count_failing_leaves_every_worker_null() -> None:
    nvml = two_gpus()
    nvml.count_error = True
    assert sampler(nvml).for_workers([101, 102]) == {101: None, 102: None}


def test_nvml_is_read_once_per_interval_for_all_workers_and_again_for_new_workers() -> None:
    nvml, clock = two_gpus(), Clock()
    gpu = sampler(nvml, clock)
    first = gpu.for_workers([101, 102])
    calls = nvml.calls
    clock.now += 0.5
    assert gpu.for_workers([102, 101]) == first and nvml.calls == calls  # cached: same workers, same interval
    nvml.devices[0].util = 5
    clock.now += 0.6
    again = gpu.for_workers([101, 102])
    assert again is not None and again[101] is not None and again[101]["util_percent"] == 5 and nvml.calls > calls
    calls = nvml.calls
    assert gpu.for_workers([103]) is not None and nvml.calls > calls  # a new round's workers are read at once


def test_nvml_library_missing_disables_quietly_and_is_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([], init_error=True)
    loads: list[int] = []

    def load() -> FakeNvml:
        loads.append(1)
        return nvml

    gpu = GpuSampler(1.0, load=load, clock=Clock())
    with caplog.at_level(logging.DEBUG, logger="elasticd"):
        assert gpu.for_workers([101]) is None and gpu.for_workers([101]) is None
    assert len(loads) == 1 and [r.levelno for r in caplog.records] == [logging.DEBUG]


def test_pynvml_not_installed_disables_quietly(caplog: pytest.LogCaptureFixture) -> None:
    def load() -> Any:
        raise ImportError("No module named 'pynvml'")

    with caplog.at_level(logging.DEBUG, logger="elasticd"):
        assert GpuSampler(1.0, load=load).for_workers([101]) is None
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


def test_this_machine_has_no_nvml_and_the_real_loader_says_so_without_raising() -> None:
    gpu = GpuSampler(1.0)
    if gpu.available():  # a GPU host: the real path works end to end instead
        assert all(r is None or "index" in r for r in (gpu.for_workers([1]) or {}).values())
    else:
        assert gpu.for_workers([1]) is None


def test_the_heartbeats_worker_records_carry_gpu_only_with_nvml() -> None:
    cfg = JobConfig(1, 1, 2, "127.0.0.1", 1, "job", "a", ["train.py"])
    agent = NodeAgent(cfg, "host", lambda op, body: None, lambda kind, **fields: None, {})
    records = [{"pid": 101, "state": "running"}, {"pid": 104, "state": "running"}, {"pid": 102, "state": "failed"}]
    agent.group = SimpleNamespace(info=lambda: records)  # type: ignore[assignment]
    agent.gpu = sampler(two_gpus())
    with_gpu = agent.workers_info()
    assert [r["gpu"] and r["gpu"]["index"] for r in with_gpu] == [0, None, None]  # an exited worker is not matched
    agent.gpu = sampler(FakeNvml([], init_error=True))
    assert agent.workers_info() == records  # no NVML: no gpu field at all
