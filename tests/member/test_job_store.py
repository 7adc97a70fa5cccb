"""The job's store for in-place resizes: one per daemon, however often the daemon is seated as coordinator."""

from __future__ import annotations

import asyncio
import sys

import psutil
import pytest

from elasticd.job.config import JobConfig
from elasticd.member.processes.spawner import Spawner
from elasticd.member.store.job_store import JobStore


def store_hosts() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True)
            if "elasticd.member.store.store_host" in " ".join(p.cmdline())]


@pytest.mark.asyncio
async def test_a_daemon_seated_twice_while_its_store_starts_gets_one_store() -> None:
    """A takeover, then a rebuild of the coordinator before the store answered: both ask for it. Two stores split a
    generation's ranks between them, and it never synced (test_job_wide_signal's etcd case, 30 s then a restart)."""
    cfg = JobConfig(1, 2, 1, "127.0.0.1", 29400, "storejob", "a", ["train.py"])
    store = JobStore()
    spawner = Spawner(sys.executable, None)
    try:
        first, second = await asyncio.gather(store.start(cfg, spawner, "127.0.0.1"),
                                             store.start(cfg, spawner, "127.0.0.1"))
        assert first == second and first.startswith("127.0.0.1:")
        assert len(store_hosts()) == 1
        assert await store.start(cfg, spawner, "127.0.0.1") == first  # seated again later: the same store
    finally:
        await store.stop()
