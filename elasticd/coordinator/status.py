"""The job's summary as `status` shows it: its state, round, restarts and counts, and one page of the node list."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast

from elasticd.coordinator.core import CoordinatorCore
from elasticd.coordinator.goodput import GoodputLedger
from elasticd.coordinator.health import NodeHealth
from elasticd.coordinator.probes import FailureProbe
from elasticd.coordinator.relay_plan import RelayPlan
from elasticd.coordinator.round_progress import timeline
from elasticd.coordinator.stragglers import Stragglers
from elasticd.coordinator.tally import NodeTally
from elasticd.job.events import EventLog
from elasticd.wire.names import Cause
from elasticd.wire.protocol import Json, JsonObject


class StatusSource(CoordinatorCore, Protocol):
    """What the summary reads of the coordinator besides the core."""

    reason: str
    target: int
    restarts: dict[Cause, int]
    events: EventLog
    status_extra: Callable[[], JsonObject]  # --rdzv-backend etcd: epoch, etcd health
    goodput: GoodputLedger
    stragglers: Stragglers
    probe: FailureProbe
    health: NodeHealth

    @property
    def tally(self) -> NodeTally: ...

    @property
    def relays(self) -> RelayPlan: ...


def job_status(c: StatusSource, now: float, offset: int = 0, limit: int | None = None) -> JsonObject:
    """The job summary, and one page of the node list in join order (all of it when `limit` is None)."""
    rnd = c.round
    ordered = sorted(c.nodes.values(), key=lambda n: n.joined_seq)
    page = ordered[offset:] if limit is None else ordered[offset:offset + limit]
    return {
        "job_id": c.cfg.job_id, "state": c.state, "reason": c.reason,
        "round": rnd.round_id if rnd else 0, "world_size": rnd.world_size if rnd else 0,
        "min_nodes": c.cfg.min_nodes, "max_nodes": c.cfg.max_nodes, "target": c.target,
        "coordinator": c.cfg.node_id, "restarts": cast(Json, dict(c.restarts)),
        "max_restarts": c.cfg.max_restarts, "scheduler": c.cfg.scheduler,
        "last_recovery": timeline(rnd) if rnd else {},
        "rank_map": cast(list[Json], rnd.public()["members"]) if rnd else [],  # RankEntryInfo: JSON types
        "nodes": [{**n.public(now), **c.health.node_fields(n.node_id)} for n in page],
        "nodes_total": len(ordered), "nodes_offset": offset,
        "node_counts": c.tally.groups(), "relays": len(c.relays.groups),
        "seq": c.events.seq, "goodput": c.goodput.share(now), "stragglers": dict(c.stragglers.named),
        "root_cause": c.probe.root_cause(), **c.health.summary(),
        **c.status_extra(),
    }
