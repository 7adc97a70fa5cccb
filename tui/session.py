"""One job's connections: calls with failover across its daemons, with timeouts; no Textual here."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from elasticd.client import AsyncClient, ClientError, Event
from tui.model import Clock, JobModel

CALL_TIMEOUT_S = 2.0
STEER_TIMEOUT_S = 6.0


class DaemonLink(Protocol):
    """What the console needs of one daemon; `elasticd.client.AsyncClient` is the live one."""

    async def call(self, op: str, timeout_s: float | None = None, **args: Any) -> dict[str, Any]: ...
    def events(self, pub: str) -> AsyncIterator[Event]: ...
    def close(self) -> None: ...


Connector = Callable[[str], DaemonLink]


def live_link(control: str) -> DaemonLink:
    return AsyncClient(control, timeout_s=CALL_TIMEOUT_S)


class JobSession:
    """A job seen through any of its daemons: the first that answers serves the whole job."""

    def __init__(self, job_id: str, seeds: list[str], connect: Connector = live_link,
                 clock: Clock = time.time, seed_pubs: dict[str, str] | None = None) -> None:
        self.job_id = job_id
        self.seeds = list(seeds)
        self.seed_pubs = dict(seed_pubs or {})
        self.connect = connect
        self.model = JobModel(job_id, clock)
        self.links: dict[str, DaemonLink] = {}
        self.active = seeds[0] if seeds else ""

    def link(self, control: str) -> DaemonLink:
        if control not in self.links:
            self.links[control] = self.connect(control)
        return self.links[control]

    def drop(self, control: str) -> None:
        link = self.links.pop(control, None)
        if link is not None:
            link.close()

    def candidates(self) -> list[str]:
        known = [n.control for n in self.model.nodes.values() if n.control and n.status == "alive"]
        order = [self.active, *self.seeds, *known]
        return [c for i, c in enumerate(order) if c and c not in order[:i]]

    async def call(self, op: str, timeout_s: float = CALL_TIMEOUT_S, **args: Any) -> dict[str, Any]:
        """Ask the active daemon, then the others; a verb's own error (refused, not found) is final."""
        last: ClientError | None = None
        for control in self.candidates():
            try:
                reply = await self.link(control).call(op, timeout_s=timeout_s, **args)
            except ClientError as err:
                if err.code not in ("timeout", "not_running"):
                    raise
                last = err
                self.drop(control)  # a fresh socket next time: a stuck peer never wedges this one
                continue
            self.active = control
            return reply
        raise last or ClientError("timeout", f"no daemon of job {self.job_id} answered")

    def followed(self) -> dict[str, tuple[str, str]]:
        """node id -> (control, pub) of every daemon to subscribe to."""
        found = {n.node_id: (n.control, n.pub) for n in self.model.nodes.values()
                 if n.control and n.pub and n.status == "alive"}
        for control, pub in self.seed_pubs.items():
            if pub not in {p for _, p in found.values()}:
                found.setdefault(f"@{control}", (control, pub))
        return found

    def close(self) -> None:
        for control in list(self.links):
            self.drop(control)
