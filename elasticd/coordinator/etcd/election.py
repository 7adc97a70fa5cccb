"""Coordinator election on etcd, as etcd's own concurrency.Election: lowest create revision wins; it is the epoch.

Each daemon holds one lease (kept alive at TTL/3) with two keys on it: `alive/<node>` (a new coordinator sees at
once who is up) and its candidacy `leader/<lease>` (value: node, instance, mesh endpoint). The candidacy with the
lowest create revision leads, and that revision is its epoch. Two threads, so that a slow watch never delays a
keep-alive; what they learn reaches the daemon's loop through `notify`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from elasticd.coordinator.etcd.client import EtcdClient, KeyValue, created_at, put
from elasticd.coordinator.etcd.errors import EtcdClusterChanged, EtcdUnavailable

log = logging.getLogger("elasticd")
WATCH_S = 1.0  # a watch returns at least this often, so a lost lease is noticed even when nothing changes
OUTAGE_RETRY_S = 0.25
KEEP_ALIVE, CAMPAIGN = "keep-alive", "campaign"  # the two threads whose word on etcd's health counts


@dataclass(frozen=True)
class Leader:
    """The daemon that leads: who it is, where its mesh ROUTER is, and its epoch."""

    node_id: str
    instance: str
    endpoint: str  # the leader daemon's mesh ROUTER
    epoch: int  # the create revision of its candidacy: every coordinator write and mesh message carries it
    key: str


@dataclass(frozen=True)
class EtcdHealth:
    """Whether etcd answers, since when, and why not."""

    ok: bool
    since: float  # wall-clock time of the change
    detail: str


class Elector:
    """This daemon's lease, its `alive` key and its candidacy; tells the daemon who leads and how etcd is."""

    def __init__(self, client: EtcdClient, prefix: str, node_id: str, instance: str, endpoint: str, ttl_s: int,
                 on_leader: Callable[[Leader | None], None], on_health: Callable[[EtcdHealth], None],
                 on_fatal: Callable[[str], None]) -> None:
        self.client, self.prefix = client, prefix
        self.node_id, self.instance, self.endpoint, self.ttl_s = node_id, instance, endpoint, ttl_s
        self.on_leader, self.on_health, self.on_fatal = on_leader, on_health, on_fatal
        self.lease = 0
        self.key = ""
        self.valid_until = 0.0  # monotonic: the lease certainly lives until then (send time of the last ack + TTL)
        self.leader: Leader | None = None
        self.healthy = True
        self.failing: dict[str, str] = {}  # thread -> what etcd last said to it
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    # ---- the daemon's side --------------------------------------------------------------------------
    def start(self) -> None:
        """The first session, on the caller's thread (an unreachable etcd is a start error), then the threads."""
        self.client.status()
        self.open_session()
        for target, name in ((self.keep_alive, "etcd-keepalive"), (self.campaign, "etcd-campaign")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self.threads.append(thread)

    def may_act(self) -> bool:
        """Whether our lease is certainly still alive: a coordinator past this stops acting (fencing layer c).

        A margin of a fifth of the TTL covers clock drift between us and etcd's leader.
        """
        return time.monotonic() < self.valid_until - self.ttl_s / 5

    def leads(self) -> bool:
        leader = self.leader
        return leader is not None and leader.key == self.key and self.may_act()

    def resign(self) -> None:
        """Revoke the lease: our candidacy and `alive` key go at once, and the next daemon takes over now."""
        self.stopping.set()
        with self.lock:
            lease, self.lease = self.lease, 0
        if lease:
            try:
                self.client.revoke(lease)
            except Exception as exc:  # it expires by itself within the TTL
                log.warning("[%s] etcd: could not revoke our lease (%s); it expires within %ds", self.node_id,
                            exc, self.ttl_s)

    # ---- the session ----------------------------------------------------------------------------------
    def open_session(self) -> None:
        sent = time.monotonic()
        lease = self.client.grant(self.ttl_s)
        key = f"{self.prefix}leader/{lease:x}"
        value = json.dumps({"node": self.node_id, "instance": self.instance, "endpoint": self.endpoint})
        alive = f"{self.prefix}alive/{self.node_id}"
        self.client.txn([created_at(key, 0)], [put(key, value, lease), put(alive, self.instance, lease)])
        with self.lock:
            self.lease, self.key, self.valid_until = lease, key, sent + self.ttl_s
        log.info("[%s] etcd: candidate %s (lease TTL %ds)", self.node_id, key, self.ttl_s)

    def keep_alive(self) -> None:
        while not self.stopping.is_set():
            lease = self.lease
            if not lease:
                self.stopping.wait(OUTAGE_RETRY_S)
                continue
            sent = time.monotonic()
            try:
                ttl = self.client.refresh(lease)
            except EtcdUnavailable as exc:
                self.health(False, str(exc), KEEP_ALIVE)
                self.stopping.wait(OUTAGE_RETRY_S)
                continue
            except EtcdClusterChanged as exc:
                self.on_fatal(str(exc))
                return
            except Exception as exc:  # a refused request: try again at the next interval
                log.warning("[%s] etcd: keep-alive failed: %s", self.node_id, exc)
                ttl = 0
            self.health(True, "", KEEP_ALIVE)
            if ttl <= 0:
                self.lost_session()
                continue
            with self.lock:
                if self.lease == lease:
                    self.valid_until = sent + ttl
            self.stopping.wait(self.ttl_s / 3)

    def lost_session(self) -> None:
        """Our lease expired (we were stopped or cut off past it): a new candidacy, at the back of the line."""
        with self.lock:
            if not self.lease:
                return
            self.lease, self.valid_until = 0, 0.0
        log.warning("[%s] etcd: our lease expired; standing again as a new candidate", self.node_id)
        self.publish(None)

    def campaign(self) -> None:
        revision = 0
        while not self.stopping.is_set():
            try:
                if not self.lease:
                    self.open_session()
                kvs, revision = self.client.get_prefix(f"{self.prefix}leader/")
                self.health(True, "", CAMPAIGN)
                self.follow(kvs)
                self.client.wait_change(f"{self.prefix}leader/", revision, WATCH_S)
            except EtcdUnavailable as exc:
                self.health(False, str(exc), CAMPAIGN)
                self.stopping.wait(OUTAGE_RETRY_S)
            except EtcdClusterChanged as exc:
                self.on_fatal(str(exc))
                return
            except Exception as exc:
                log.warning("[%s] etcd: election step failed: %s", self.node_id, exc)
                self.stopping.wait(OUTAGE_RETRY_S)

    def follow(self, kvs: list[KeyValue]) -> None:
        """The lowest create revision leads; our own key gone means our lease is gone."""
        if self.key and not any(kv.key == self.key for kv in kvs):
            self.lost_session()
            return
        if not kvs:
            return
        first = min(kvs, key=lambda kv: kv.create_revision)
        data = json.loads(first.value)
        self.publish(Leader(data["node"], data["instance"], data["endpoint"], first.create_revision, first.key))

    def publish(self, leader: Leader | None) -> None:
        if leader != self.leader:
            self.leader = leader
            self.on_leader(leader)

    def health(self, ok: bool, detail: str, who: str) -> None:
        """etcd is healthy while neither thread is failing: a lease's keep-alive needs no rights on the job's
        keys, so it must not call etcd back while the election is refused (a role revoked) or cut off."""
        with self.lock:
            if ok:
                self.failing.pop(who, None)
            else:
                self.failing[who] = detail
            healthy = not self.failing
            changed, self.healthy = healthy != self.healthy, healthy
            why = next(iter(self.failing.values()), "")
        if changed:
            self.on_health(EtcdHealth(healthy, time.time(), why))
