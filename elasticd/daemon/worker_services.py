"""What this node's workers start from: a warm zygote, the store tunnel (--keys), and the job's store."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Coroutine

import zmq.asyncio

from elasticd.coordinator.coordinator import Coordinator
from elasticd.job.config import JobConfig
from elasticd.keys.auth import NodeKeys
from elasticd.member.agent import NodeAgent
from elasticd.member.processes.spawner import Spawner, Zygote
from elasticd.member.processes.workers import base_env
from elasticd.member.store.job_store import JobStore
from elasticd.member.store.round_store import RoundStore
from elasticd.member.store.store_host import LOOPBACK
from elasticd.member.store.store_tunnel import JOB_STORE, TunnelServer

ZYGOTE_WARMUP_S = 60.0  # past this, register anyway: workers are then exec'd cold


class WorkerServices:
    """The node's zygote (--zygote), its store tunnel and round stores (--keys), and, while this daemon
    coordinates, the job's store (in-place resizes of shim workers)."""

    def __init__(self, cfg: JobConfig, ctx: zmq.asyncio.Context, host: str, node: NodeAgent) -> None:
        self.cfg, self.ctx, self.host, self.node = cfg, ctx, host, node
        self.zygote: Zygote | None = None
        self.tunnel: TunnelServer | None = None  # with --keys: how other nodes reach our round's store
        self.job_store = JobStore()

    def bind_tunnel(self, keys: NodeKeys) -> str:
        """With --keys: our store tunnel's endpoint, which other nodes reach our rounds' stores through."""
        self.tunnel = TunnelServer(self.ctx, keys, self.host, self.cfg.port_range)
        return self.tunnel.endpoint

    async def start(self, keys: NodeKeys | None) -> None:
        """The zygote starts warming up (--zygote); with --keys, each round's store is loopback-only."""
        if self.cfg.zygote:
            self.zygote = Zygote(self.cfg.python or sys.executable, self.cfg.preload, base_env(self.cfg))
            await self.zygote.start()
        round_store = None
        if keys is not None and self.tunnel is not None:  # a Python spawner even with --no-python
            round_store = RoundStore(self.cfg, self.ctx, keys, self.tunnel, Spawner(self.cfg.python, self.zygote))
        self.node.equip(Spawner(self.cfg.python, self.zygote, no_python=self.cfg.no_python), round_store)

    async def warm(self) -> None:
        """Until the zygote has imported what workers preload, or ZYGOTE_WARMUP_S passed."""
        if self.zygote is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.zygote.ready.wait(), ZYGOTE_WARMUP_S)

    def tasks(self) -> list[asyncio.Task[object]]:
        return [asyncio.create_task(self.tunnel.serve())] if self.tunnel is not None else []

    def host_job_store(self, coordinator: Coordinator,
                       spawn: Callable[[Coroutine[object, object, object]], None]) -> None:
        """In-place resizes need the job's store on the coordinator's node: ours, while we coordinate."""
        if not self.cfg.no_python:
            coordinator.resizer.job_store_starting()
            spawn(self.start_job_store(coordinator))

    async def start_job_store(self, coordinator: Coordinator) -> None:
        """With --keys it binds loopback and every node reaches it through our store tunnel (JOB_STORE); without,
        our advertised address, which every node's workers (ours too) reach directly. Never every interface: a
        keyed job's store would then answer anyone who reaches this host."""
        addr, tunnel = "", ""
        try:
            bind = LOOPBACK if self.tunnel is not None else self.host
            addr = await self.job_store.start(self.cfg, self.node.spawner, bind)
            if addr and self.tunnel is not None:
                self.tunnel.host_round(JOB_STORE, int(addr.rpartition(":")[2]))
                tunnel = self.tunnel.endpoint
        finally:
            coordinator.resizer.job_store_started(addr, tunnel)

    async def stop(self) -> None:
        """Once our workers stopped: the job's store, then the zygote."""
        await self.job_store.stop()
        if self.node.round_store is not None:
            self.node.round_store.close_job_store()
        if self.zygote is not None:
            await self.zygote.close()

    def close(self) -> None:
        if self.tunnel is not None:
            self.tunnel.close()
