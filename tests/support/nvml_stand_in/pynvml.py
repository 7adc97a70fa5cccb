"""A stand-in for nvidia-ml-py on a machine without GPUs: one device, whose faults a test writes to a JSON file.

FAKE_NVML_STATE names the file: {"xids": [79, ...], "ecc": N, "pending_pages": bool, "remap": [pending, failed],
"throttle": MASK}. Read at each call, so a test changes the device while the daemon runs. Put this folder first on
PYTHONPATH (tests/support/health.py); the names and shapes are pynvml's own.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

NVML_TEMPERATURE_GPU = 0
nvmlEventTypeXidCriticalError = 8
HANDLE = "gpu0"


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):
    pass


def _state() -> dict:
    path = os.environ.get("FAKE_NVML_STATE", "")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def nvmlInit() -> None: ...
def nvmlDeviceGetCount() -> int: return 1
def nvmlDeviceGetHandleByIndex(index: int) -> str: return HANDLE
def nvmlDeviceGetIndex(handle: str) -> int: return 0
def nvmlEventSetCreate() -> dict: return {"seen": 0}
def nvmlDeviceRegisterEvents(handle: str, kinds: int, events: dict) -> None: ...


def nvmlEventSetWait(events: dict, timeout_ms: int) -> SimpleNamespace:
    xids = _state().get("xids", [])
    if events["seen"] >= len(xids):
        raise NVMLError_Timeout("Timeout")
    events["seen"] += 1
    return SimpleNamespace(device=HANDLE, eventType=nvmlEventTypeXidCriticalError, eventData=xids[events["seen"] - 1])


def nvmlDeviceGetTotalEccErrors(handle: str, kind: int, counter: int) -> int: return int(_state().get("ecc", 0))
def nvmlDeviceGetRetiredPagesPendingStatus(handle: str) -> int: return int(bool(_state().get("pending_pages")))
def nvmlDeviceGetRemappedRows(handle: str) -> tuple[int, int, int, int]:
    pending, failed = _state().get("remap", [0, 0])
    return 0, 0, int(pending), int(failed)


def nvmlDeviceGetCurrentClocksEventReasons(handle: str) -> int: return int(_state().get("throttle", 0))
def nvmlDeviceGetMemoryInfo(handle: str) -> SimpleNamespace: return SimpleNamespace(used=2**30, total=80 * 2**30)
def nvmlDeviceGetPowerUsage(handle: str) -> int: return 250_000
def nvmlDeviceGetUtilizationRates(handle: str) -> SimpleNamespace: return SimpleNamespace(gpu=93)
def nvmlDeviceGetTemperature(handle: str, sensor: int) -> int: return 61
def nvmlDeviceGetComputeRunningProcesses(handle: str) -> list: return []
def nvmlDeviceGetGraphicsRunningProcesses(handle: str) -> list: return []
