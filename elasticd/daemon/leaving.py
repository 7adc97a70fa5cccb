"""A leave signal (--signals-to-handle), by the role this daemon holds when it comes.

A member leaves; the embedded coordinator's node ends the job; an elected coordinator's node (--rdzv-backend etcd)
hands the role over.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Coroutine
from typing import Protocol

from elasticd.coordinator.coordinator import Coordinator
from elasticd.daemon.failover import Failover
from elasticd.job.config import JobConfig
from elasticd.member.link import Member
from elasticd.wire.names import JobState

log = logging.getLogger("elasticd")


class Leaver(Protocol):
    """What a leave needs of its daemon: the roles it holds now, and where its tasks run."""

    cfg: JobConfig
    member: Member
    failover: Failover | None

    @property
    def coordinator(self) -> Coordinator | None: ...
    def spawn(self, coro: Coroutine[object, object, object]) -> None: ...


class Leave:
    """How this daemon leaves its job when signalled: gracefully the first time, at once the second."""

    def __init__(self, daemon: Leaver) -> None:
        self.d = daemon
        self.signalled = False  # the coordinator's node got its first leave signal: the job is stopping gracefully

    def on_signal(self, sig: int) -> None:
        node_id = self.d.cfg.node_id
        log.info("[%s] received %s", node_id, signal.Signals(sig).name)
        self.leave(f"node {node_id}'s elasticd received {signal.Signals(sig).name}")

    def leave(self, reason: str) -> None:
        """SIGTERM/SIGINT/HUP: a member leaves; the embedded coordinator's node ends the job (with etcd it hands over).

        Both are graceful the first time: shim ranks stop at one agreed step with a checkpoint (a member's
        drain, the coordinator's `stop`), bounded by --grace-period; a second signal ends it at once.
        """
        d, c = self.d, self.d.coordinator
        if d.failover is not None and c is not None:
            self.hand_over(d.failover, reason)
            return
        if c is None:
            d.member.leave(reason)
            return
        why = f"{reason}; it is the coordinator, so the job ends (no coordinator HA without --rdzv-backend etcd)"
        if self.signalled or c.state != JobState.running:
            c.end(JobState.stopped, why, time.time())
            return
        self.signalled = True
        c.stop_gracefully(why)  # a member's leave in flight (a job-wide signal) folds into it
        d.spawn(self.end_after_grace(why))

    def hand_over(self, failover: Failover, reason: str) -> None:
        """The elected coordinator's node drains like any member's, then exits: the role goes to the next daemon."""
        m = self.d.member
        if m.leaving or not failover.may_drain_own_node():
            m.depart(f"{reason}; handing the coordinator role over")  # `leave` to ourselves: left now, then exit
            return
        m.hand_over(reason)
        failover.drain_own_node(reason)

    async def end_after_grace(self, why: str) -> None:
        grace_s = self.d.cfg.grace_s
        await asyncio.sleep(grace_s)
        c = self.d.coordinator
        if c is not None:
            c.end(JobState.stopped, f"{why}; --grace-period {grace_s:g}s ran out", time.time())
