"""Each round's c10d store with --keys: a loopback store host on the master node, a tunnel relay on the others."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

import zmq.asyncio

from elasticd.job.config import JobConfig
from elasticd.keys.auth import NodeKeys
from elasticd.member.processes.spawner import Spawner, WorkerProcess
from elasticd.member.processes.workers import base_env, signal_worker
from elasticd.member.store.store_host import LOOPBACK, READY
from elasticd.member.store.store_tunnel import JOB_STORE, RoundRelay, TunnelServer
from elasticd.wire.assignment import RoundAssignment

log = logging.getLogger("elasticd")
STORE_HOST_ENTRY = ["-m", "elasticd.member.store.store_host"]
START_TIMEOUT_S = 60.0  # a loaded machine's python start (the host imports torch later, at its first client)
STOP_TIMEOUT_S = 5.0


class StoreError(Exception):
    """The round's store could not be opened here; the message says why."""


def store_env(port: int) -> dict[str, str]:
    """What workers get instead of rank 0's store: every rank is a client of the store on its own loopback."""
    return {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True"}


async def read_port(proc: WorkerProcess) -> int | None:
    """The port in the store host's `READY PORT` line; what torch prints before it (warnings) goes to the log."""
    assert proc.stdout is not None
    async for raw in proc.stdout:
        line = raw.decode(errors="replace").strip()
        word, _, port = line.partition(" ")
        if word == READY and port.isdigit():
            return int(port)
        log.info("store host %d: %s", proc.pid, line)
    return None


class StoreHost:
    """One round's store host process (elasticd/member/store/store_host.py), forked from the zygote or exec'd."""

    def __init__(self, proc: WorkerProcess, port: int) -> None:
        self.proc, self.port = proc, port
        self.output = asyncio.create_task(self.log_output())  # keep its pipe drained; torch may warn there

    @classmethod
    async def start(cls, spawner: Spawner, env: dict[str, str], bind: str = "") -> StoreHost:
        proc = await spawner.spawn([*STORE_HOST_ENTRY, *([bind] if bind else [])], env, os.getcwd())
        try:
            port = await asyncio.wait_for(read_port(proc), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            port, why = None, f"was not ready within {START_TIMEOUT_S:.0f} s"
        else:
            why = "exited before it was ready"
        if port is None:
            signal_worker(proc.pid, signal.SIGKILL)
            raise StoreError(f"the store host on {bind or LOOPBACK} {why} (its output is in the daemon's log)")
        return cls(proc, port)

    async def log_output(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            log.info("store host %d: %s", self.proc.pid, line.decode(errors="replace").rstrip())

    async def stop(self) -> None:
        signal_worker(self.proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), STOP_TIMEOUT_S)
        except asyncio.TimeoutError:
            signal_worker(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()
        # Its output ends at EOF, which any other holder of the pipe's write end would withhold: the process is
        # gone, so shutdown never waits on its last lines for long.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.output, STOP_TIMEOUT_S)


class RoundStore:
    """Opens the store endpoint of each round for this node's workers, and closes it with them."""

    def __init__(self, cfg: JobConfig, ctx: zmq.asyncio.Context, keys: NodeKeys, tunnel: TunnelServer,
                 spawner: Spawner) -> None:
        self.cfg, self.ctx, self.keys, self.tunnel, self.spawner = cfg, ctx, keys, tunnel, spawner
        self.round_id = 0
        self.host: StoreHost | None = None
        self.relay: RoundRelay | None = None
        self.job_relay: tuple[str, RoundRelay, int] | None = None  # (tunnel, relay, port) to the job's store
        self.stopping: set[asyncio.Task[None]] = set()

    async def job_store(self, tunnel: str) -> str:
        """Where this node's workers reach the job's long-lived store: one relay for the job, opened once."""
        if self.job_relay is None or self.job_relay[0] != tunnel:
            if self.job_relay is not None:
                self.job_relay[1].close()
            relay = RoundRelay(self.ctx, self.keys, JOB_STORE, tunnel)
            self.job_relay = (tunnel, relay, await relay.start())
        return f"{LOOPBACK}:{self.job_relay[2]}"

    def close_job_store(self) -> None:
        if self.job_relay is not None:
            self.job_relay[1].close()
            self.job_relay = None

    async def open(self, round_id: int, assignment: RoundAssignment) -> dict[str, str]:
        """The env that points this node's workers at the round's store: its own, or the tunnel to the master's."""
        await self.close()
        self.round_id = round_id
        if 0 in assignment.ranks:  # rank 0's node is the round's master node: it hosts the store
            self.host = await StoreHost.start(self.spawner, {**base_env(self.cfg), "ELASTICD_ROUND": str(round_id)})
            self.tunnel.host_round(round_id, self.host.port)
            return store_env(self.host.port)
        master_tunnel = assignment.store_tunnel
        if not master_tunnel:
            raise StoreError("the round's master node has no store tunnel (is it running with --keys?)")
        self.relay = RoundRelay(self.ctx, self.keys, round_id, master_tunnel)
        return store_env(await self.relay.start())

    async def close(self) -> None:
        if self.round_id:
            self.tunnel.close_round(self.round_id)
        relay, host, self.relay, self.host = self.relay, self.host, None, None
        if relay is not None:
            relay.close()
        if host is not None:  # its exit is not waited for: the next round's store has a port of its own
            task = asyncio.create_task(host.stop())
            self.stopping.add(task)
            task.add_done_callback(self.stopping.discard)
