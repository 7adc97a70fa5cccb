"""A daemon's etcd session (--rdzv-backend etcd): the client, its candidacy and lease, and whether etcd answers.

The election runs on etcd's threads (elasticd/coordinator/etcd/election.py); what it learns reaches the daemon's
loop here, and nowhere else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from elasticd.coordinator.etcd.access import check_files, password_source
from elasticd.coordinator.etcd.client import EtcdClient
from elasticd.coordinator.etcd.election import Elector, EtcdHealth, Leader
from elasticd.coordinator.etcd.errors import EtcdClusterChanged, EtcdRefused, EtcdUnavailable
from elasticd.coordinator.etcd.store import job_prefix
from elasticd.job.config import JobConfig, StartError
from elasticd.wire.protocol import JsonObject

log = logging.getLogger("elasticd")
News = TypeVar("News")


def etcd_client(cfg: JobConfig) -> EtcdClient:
    """The job's etcd client; without etcd3gw installed, or with TLS files that cannot work, a start error."""
    access = cfg.etcd_access
    try:
        check_files(access)
        return EtcdClient(list(cfg.etcd_endpoints), access=access, prefix=job_prefix(cfg.job_id),
                          password=password_source(access))
    except (ImportError, EtcdRefused) as exc:
        raise StartError(f"--rdzv-backend etcd: {exc}" if isinstance(exc, EtcdRefused) else str(exc)) from None


class EtcdSession:
    """This daemon's lease and candidacy on etcd, and etcd's health as the daemon's loop last heard it."""

    def __init__(self, cfg: JobConfig, client: EtcdClient, instance: str, endpoint: str,
                 on_leader: Callable[[Leader | None], None], on_health: Callable[[EtcdHealth], None],
                 on_fatal: Callable[[str], None]) -> None:
        self.cfg, self.client, self.endpoint = cfg, client, endpoint
        self.prefix = job_prefix(cfg.job_id)
        self.on_health = on_health
        self.loop: asyncio.AbstractEventLoop | None = None
        self.health = EtcdHealth(True, time.time(), "")
        self.elector = Elector(client, self.prefix, cfg.node_id, instance, endpoint, cfg.lease_ttl_s,
                               self.threadsafe(on_leader), self.threadsafe(self.note_health),
                               self.threadsafe(on_fatal))

    def start(self) -> None:
        """Our lease and candidacy: etcd unreachable, another cluster or a refusal is a start error (exit 2)."""
        self.loop = asyncio.get_running_loop()
        try:
            self.elector.start()
        except (EtcdUnavailable, EtcdClusterChanged) as exc:
            raise StartError(f"--rdzv-backend etcd: {exc}") from None
        except Exception as exc:  # a refused request (auth, a proxy that is not etcd): one line, exit 2
            raise StartError(f"--rdzv-backend etcd: etcd refused us: {str(exc).splitlines()[0][:200]}") from None
        log.info("[%s] etcd: cluster %s (%s); mesh %s", self.cfg.node_id, self.client.cluster_id,
                 self.cfg.etcd_access.describe(), self.endpoint)

    def resign(self) -> None:
        """Our lease revoked: the next daemon takes over at once."""
        self.elector.resign()

    def threadsafe(self, handler: Callable[[News], None]) -> Callable[[News], None]:
        def call(arg: News) -> None:
            if self.loop is not None and not self.loop.is_closed():
                self.loop.call_soon_threadsafe(handler, arg)
        return call

    def leads(self, leader: Leader) -> bool:
        """Whether `leader` is our own candidacy."""
        return leader.key == self.elector.key

    def may_act(self) -> bool:
        """Whether our lease is certainly alive: a coordinator that is not sure of it decides nothing."""
        return self.elector.may_act()

    def note_health(self, health: EtcdHealth) -> None:
        self.health = health
        if health.ok:
            log.warning("[%s] etcd is reachable again: membership changes resume", self.cfg.node_id)
        else:
            log.warning("[%s] etcd unreachable or refusing us (%s): membership is frozen; training goes on in the "
                        "current world; the job stops if this lasts %.0fs", self.cfg.node_id, health.detail,
                        self.cfg.etcd_outage_s)
        self.on_health(health)

    def outage_over(self, now: float) -> bool:
        """etcd has been unreachable past --rdzv-conf etcd_outage_timeout: the job stops."""
        return not self.health.ok and now - self.health.since > self.cfg.etcd_outage_s

    def status(self, epoch: int) -> JsonObject:
        """What `status` adds on an elected coordinator: its epoch and etcd's health."""
        health, now = self.health, time.time()
        extra: JsonObject = {
            "rdzv_backend": "etcd", "epoch": epoch,
            "etcd": {"ok": health.ok, "since": health.since, "detail": health.detail,
                     "endpoints": [f"{h}:{p}" for h, p in self.cfg.etcd_endpoints],
                     "access": self.cfg.etcd_access.describe(),
                     "outage_limit_s": self.cfg.etcd_outage_s}}
        if not health.ok:
            extra["reason"] = (f"etcd unreachable for {now - health.since:.0f}s: membership frozen, training goes on "
                               f"in the current world; the job stops after {self.cfg.etcd_outage_s:g}s")
        return extra
