"""A node's health, checked every --health-interval off the daemon's loop, told to the coordinator (docs/health.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from elasticd.job.config import JobConfig
from elasticd.member.health_checks import NvmlHealth, check_folder, run_command
from elasticd.wire.health import HealthFinding, HealthReport
from elasticd.wire.names import HealthCheck

log = logging.getLogger("elasticd")
REGISTERED_POLL_S = 0.5  # how soon a fresh registration (a new coordinator too) hears the last verdict again


class HealthMonitor:
    """Runs the checks, reports each verdict (the coordinator keeps the last), logs a change of verdict once."""

    def __init__(self, cfg: JobConfig, send: Callable[[HealthReport], None], registered: Callable[[], bool],
                 checkpoints: Callable[[], list[str]] = list, nvml: Callable[[], NvmlHealth] = NvmlHealth) -> None:
        self.cfg, self.send, self.registered, self.make_nvml = cfg, send, registered, nvml
        self.checkpoints = checkpoints  # the folders this node's ranks last saved to
        self.nvml: NvmlHealth | None = None
        self.nvml_busy = False  # a device read still running past the timeout: not started again meanwhile
        self.last: HealthReport | None = None

    async def run(self) -> None:
        self.nvml = await asyncio.to_thread(self.make_nvml)  # nvmlInit can take seconds on a big node
        while True:
            try:
                report = await self.check()
            except Exception:  # a bug in one check must not end the others for good: said, and tried again
                log.exception("[%s] health: a check failed to run", self.cfg.node_id)
            else:
                changed = report.reasons() != self.last.reasons() if self.last else not report.healthy
                if changed:
                    self.note(report)
                self.last = report
                self.send(report)
            await self.wait_interval()

    async def wait_interval(self) -> None:
        """Until the next check; a registration meanwhile (a new coordinator, a rejoin) hears the verdict at once."""
        was = self.registered()
        for _ in range(max(1, round(self.cfg.health_interval_s / REGISTERED_POLL_S))):
            await asyncio.sleep(min(REGISTERED_POLL_S, self.cfg.health_interval_s))
            now = self.registered()
            if now and not was and self.last is not None:
                self.send(self.last)
            was = now

    async def check(self) -> HealthReport:
        folders = [(self.cfg.log_dir, HealthCheck.log_dir)] + [(f, HealthCheck.checkpoint_dir)
                                                                for f in self.checkpoints()]
        checks = [*([HealthCheck.command] if self.cfg.health_command else []),
                  *(self.nvml.checks() if self.nvml else []), *dict.fromkeys(c for _, c in folders)]
        parts = await asyncio.gather(self.command(), self.devices(), *(self.folder(f, c) for f, c in folders))
        return HealthReport(checks, [f for part in parts for f in part])

    async def command(self) -> list[HealthFinding]:
        if not self.cfg.health_command:
            return []
        try:
            finding = await run_command(self.cfg.health_command, self.cfg.health_timeout_s)
        except OSError as exc:  # no shell, no fork: the check itself cannot run on this node
            finding = HealthFinding(HealthCheck.command, f"could not run: {exc}")
        return [finding] if finding else []

    async def devices(self) -> list[HealthFinding]:
        nvml = self.nvml
        if nvml is None or not nvml.checks():
            return []
        if self.nvml_busy:
            return [HealthFinding(HealthCheck.nvml, f"NVML has not answered for over {self.cfg.health_timeout_s:g}s")]
        self.nvml_busy = True
        task = asyncio.ensure_future(asyncio.to_thread(nvml.check))
        task.add_done_callback(lambda _t: setattr(self, "nvml_busy", False))
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.cfg.health_timeout_s)
        except TimeoutError:
            return [HealthFinding(HealthCheck.nvml, f"NVML did not answer within {self.cfg.health_timeout_s:g}s")]

    async def folder(self, path: str, check: HealthCheck) -> list[HealthFinding]:
        with contextlib.suppress(TimeoutError):
            finding = await asyncio.wait_for(asyncio.to_thread(check_folder, path, check), self.cfg.health_timeout_s)
            return [finding] if finding else []
        return [HealthFinding(check, f"{path} did not answer within {self.cfg.health_timeout_s:g}s (a hung "
                                     "filesystem)")]

    def note(self, report: HealthReport) -> None:
        if report.healthy:
            log.info("[%s] health: %s pass", self.cfg.node_id, ", ".join(report.checks))
        else:
            log.warning("[%s] health: UNHEALTHY: %s", self.cfg.node_id, "; ".join(report.reasons()))
