"""The job's long-lived c10d store for in-place resizes: one store host on the coordinator's node, for the whole job.

Each generation's process group lives under its own prefix in it (trainer_shim/generation.py): a new TCPStore per
generation cost ~680 ms p90 to init, a prefix in one long-lived store ~3 ms (docs/architecture.md, "Generations").
"""

from __future__ import annotations

import asyncio
import logging

from elasticd.job.config import JobConfig
from elasticd.member.processes.spawner import Spawner
from elasticd.member.processes.workers import base_env
from elasticd.member.store.round_store import StoreError, StoreHost

log = logging.getLogger("elasticd")


class JobStore:
    """Started once by the coordinator's daemon; its address goes to every worker in each round's assignment."""

    def __init__(self) -> None:
        self.host: StoreHost | None = None
        self.addr = ""
        self.starting: asyncio.Future[str] | None = None

    async def start(self, cfg: JobConfig, spawner: Spawner, bind: str) -> str:
        """host:port of the store, or "" when it could not start (then every round restarts its workers).

        Once per daemon: a daemon elected coordinator again (etcd) keeps the store it started the first time, and
        one seated twice while its store is still starting (a takeover, then a rebuild) waits for that one: two
        stores would split a generation's ranks between them, and it would never sync."""
        if self.host is not None:
            return self.addr
        starting = self.starting = self.starting or asyncio.ensure_future(self._start(cfg, spawner, bind))
        try:
            return await asyncio.shield(starting)
        finally:
            if starting.done() and self.starting is starting:
                self.starting = None  # started, or failed: a later call returns the store or tries again

    async def _start(self, cfg: JobConfig, spawner: Spawner, bind: str) -> str:
        try:
            self.host = await StoreHost.start(spawner, base_env(cfg), bind)
        except (OSError, StoreError) as exc:
            log.warning("[%s] no job store for in-place resizes (%s): membership changes restart workers",
                        cfg.node_id, exc)
            return ""
        self.addr = f"{bind}:{self.host.port}"
        log.info("[%s] job store for in-place resizes at %s (pid %d)", cfg.node_id, self.addr, self.host.proc.pid)
        return self.addr

    async def stop(self) -> None:
        if self.host is not None:
            await self.host.stop()
            self.host = None
