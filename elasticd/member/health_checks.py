"""One node's health checks (docs/health.md): the site's command, NVML's error counters, the daemon's log folder."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from typing import Any

from elasticd.member.gpu import load_pynvml
from elasticd.wire.health import HealthFinding
from elasticd.wire.names import HealthCheck

log = logging.getLogger("elasticd")
OUTPUT_TAIL = 4096  # bytes of a command's output kept: its last line is the reason
MIN_FREE_BYTES = 256 * 2**20  # a log folder with less free is full (a worker's log, a checkpoint would fail)
MIN_FREE_SHARE = 0.01
# nvmlClocksEventReason* bits that mean the GPU is being held back by a fault, not by a normal power cap
THROTTLES = {0x8: "HW_SLOWDOWN", 0x40: "HW_THERMAL_SLOWDOWN", 0x80: "HW_POWER_BRAKE_SLOWDOWN"}
UNCORRECTED, VOLATILE, FEATURE_ENABLED = 1, 0, 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC


async def run_command(command: str, timeout_s: float) -> HealthFinding | None:
    """`sh -c COMMAND`: a non-zero exit or running past the timeout (then its process group is killed) fails."""
    proc = await asyncio.create_subprocess_shell(command, stdin=asyncio.subprocess.DEVNULL,
                                                 stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                 start_new_session=True)
    tail = bytearray()

    async def read() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            tail.extend(chunk)
            del tail[:-OUTPUT_TAIL]
        await proc.wait()

    try:
        await asyncio.wait_for(read(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return HealthFinding(HealthCheck.command, f"timed out after {timeout_s:g}s")
    returncode = proc.returncode or 0
    if returncode == 0:
        return None
    lines = [line.strip() for line in tail.decode(errors="replace").splitlines() if line.strip()]
    code = f"exit code {returncode}" if returncode > 0 else f"signal {-returncode}"
    return HealthFinding(HealthCheck.command, lines[-1][:500] if lines else f"failed ({code})")


def check_folder(path: str, check: HealthCheck = HealthCheck.log_dir) -> HealthFinding | None:
    """A folder the job writes (the daemon's logs, the ranks' checkpoints): writable, and not nearly full. The
    daemon makes its log folder; a checkpoint folder is the ranks', so one that is gone (pruned) is not checked."""
    if check != HealthCheck.log_dir and not os.path.isdir(path):
        return None
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".health-"):
            pass
        usage = shutil.disk_usage(path)
    except OSError as exc:
        return HealthFinding(check, f"{path} is not writable: {exc.strerror or exc}")
    if usage.free < max(MIN_FREE_BYTES, MIN_FREE_SHARE * usage.total):
        return HealthFinding(check, f"{path} is nearly full: {usage.free / 2**20:.0f} MiB free of "
                                    f"{usage.total / 2**30:.0f} GiB")
    return None


class NvmlHealth:
    """NVML's error counters on every device: XID events, uncorrectable ECC errors that rose since we started,
    pages pending retirement, failed or pending row remaps, fault throttling seen twice in a row. Each read that a
    device does not support is left out; without NVML there is nothing to check."""

    def __init__(self, load: Callable[[], Any] = load_pynvml) -> None:
        self.nvml: Any = None
        self.handles: list[Any] = []
        self.events: Any = None  # the XID event set, where a device supports it
        self.ecc_start: dict[int, int] = {}
        self.sticky: list[HealthFinding] = []  # an XID or a rise in ECC errors stays a reason: the GPU needs a reset
        self.throttled: set[int] = set()
        self.start(load)

    def start(self, load: Callable[[], Any]) -> None:
        try:
            nvml = load()
            nvml.nvmlInit()
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except Exception as exc:  # no pynvml, no driver, no GPU: nothing to check here
            log.debug("no NVML health checks: %s", exc)
            return
        self.nvml = nvml
        self.events = self.try_call(nvml.nvmlEventSetCreate)
        for index, handle in enumerate(self.handles):
            if self.events is not None:
                self.try_call(nvml.nvmlDeviceRegisterEvents, handle, nvml.nvmlEventTypeXidCriticalError, self.events)
            count = self.try_call(nvml.nvmlDeviceGetTotalEccErrors, handle, UNCORRECTED, VOLATILE)
            if count is not None:
                self.ecc_start[index] = int(count)

    def try_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def checks(self) -> list[HealthCheck]:
        if self.nvml is None:
            return []
        return [*([HealthCheck.xid] if self.events is not None else []), HealthCheck.ecc, HealthCheck.retired_pages,
                HealthCheck.row_remap, HealthCheck.throttle]

    def check(self) -> list[HealthFinding]:
        """Every device, now (a few NVML calls each: run it off the daemon's loop)."""
        if self.nvml is None:
            return []
        self.drain_xids()
        found = [finding for index, handle in enumerate(self.handles) for finding in self.device(index, handle)]
        return self.sticky + found

    def drain_xids(self) -> None:
        nvml = self.nvml
        while self.events is not None:
            try:
                event = nvml.nvmlEventSetWait(self.events, 0)
            except nvml.NVMLError:  # NVML_ERROR_TIMEOUT: none waiting
                return
            index = self.try_call(nvml.nvmlDeviceGetIndex, event.device)
            self.sticky.append(HealthFinding(HealthCheck.xid, f"GPU {'?' if index is None else index}: "
                                                              f"XID {event.eventData}"))

    def device(self, index: int, handle: Any) -> list[HealthFinding]:
        nvml, found = self.nvml, []
        ecc = self.try_call(nvml.nvmlDeviceGetTotalEccErrors, handle, UNCORRECTED, VOLATILE)
        start = self.ecc_start.get(index)
        if ecc is not None and start is not None and int(ecc) > start:
            self.ecc_start[index] = int(ecc)  # it stays a reason (sticky) until the daemon restarts
            self.sticky.append(HealthFinding(HealthCheck.ecc, f"GPU {index}: uncorrectable ECC errors {start} -> "
                                                              f"{int(ecc)}"))
        if self.try_call(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle) == FEATURE_ENABLED:
            found.append(HealthFinding(HealthCheck.retired_pages, f"GPU {index}: pages pending retirement (reset "
                                                                  "the GPU)"))
        rows = self.try_call(nvml.nvmlDeviceGetRemappedRows, handle)
        if rows is not None and (rows[3] or rows[2]):
            found.append(HealthFinding(HealthCheck.row_remap, f"GPU {index}: " + (
                "a row remap failed" if rows[3] else "a row remap is pending (reset the GPU)")))
        found += self.throttle(index, handle)
        return found

    def throttle(self, index: int, handle: Any) -> list[HealthFinding]:
        nvml = self.nvml
        read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        mask = self.try_call(read, handle) if read is not None else None
        names = [name for bit, name in THROTTLES.items() if mask is not None and int(mask) & bit]
        if not names:
            self.throttled.discard(index)
            return []
        if index not in self.throttled:  # once may be a passing spike: twice in a row is a reason
            self.throttled.add(index)
            return []
        return [HealthFinding(HealthCheck.throttle, f"GPU {index}: {', '.join(names)}")]
