"""Typed replies for the Python client: what `status`, `metrics` and the steering verbs return."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TypeVar

from elasticd.wire.protocol import Json, JsonObject

T = TypeVar("T")


def _build(cls: type[T], data: Mapping[str, object]) -> T:
    """Known fields by name; the whole reply stays in `raw` so newer fields are never lost."""
    names = {f.name for f in fields(cls)} - {"raw"}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names}, raw=data)  # type: ignore[call-arg]


def _objects(value: Json) -> list[JsonObject]:
    """The objects in a reply's list (its nodes, its ranks)."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


@dataclass(frozen=True)
class NodeInfo:
    """One node of a `status` reply."""

    node_id: str
    host: str
    role: str
    status: str
    nproc: int = 0
    last_seen_age_s: float = 0.0
    restarts: dict[str, int] = field(default_factory=dict)
    workers: list[JsonObject] = field(default_factory=list)
    raw: JsonObject = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class JobStatus:
    """A `status` reply: the job, its round, restarts and nodes."""

    job_id: str
    state: str
    round: int
    world_size: int
    min_nodes: int
    max_nodes: int
    target: int
    coordinator: str
    restarts: dict[str, int]
    max_restarts: int
    seq: int
    reason: str = ""
    last_recovery: dict[str, float] = field(default_factory=dict)
    nodes: list[NodeInfo] = field(default_factory=list)
    rank_map: dict[str, list[int]] = field(default_factory=dict)
    refused_keys: int = 0  # connections the daemon that answered has refused since it started
    raw: dict[str, object] = field(default_factory=dict, repr=False)  # the reply, with `nodes` and `rank_map` as parsed

    @classmethod
    def parse(cls, reply: JsonObject) -> JobStatus:
        data = {**reply, "nodes": [_build(NodeInfo, n) for n in _objects(reply.get("nodes", []))],
                "rank_map": {str(e["node_id"]): e["ranks"] for e in _objects(reply.get("rank_map", []))}}
        return _build(cls, data)


@dataclass(frozen=True)
class RankMetrics:
    """One rank of a `metrics` reply: its step, loss, throughput and checkpoint age."""

    node: str
    rank: int
    round: int | None = None
    step: int | None = None
    loss: float | None = None
    throughput: float | None = None
    step_age_s: float | None = None
    checkpoint_step: int | None = None
    checkpoint_age_s: float | None = None
    raw: JsonObject = field(default_factory=dict, repr=False)

    @classmethod
    def parse_all(cls, reply: JsonObject) -> list[RankMetrics]:
        return [_build(cls, r) for r in _objects(reply.get("ranks", []))]


@dataclass(frozen=True)
class SteerResult:
    """A steering verb's answer: accepted (with an op id to follow in events), or a dry run's plan."""

    accepted: bool = False
    dry_run: bool = False
    op_id: str = ""
    plan: JsonObject = field(default_factory=dict)
    raw: JsonObject = field(default_factory=dict, repr=False)

    @property
    def summary(self) -> str:
        return str(self.plan.get("summary", ""))

    @classmethod
    def parse(cls, reply: JsonObject) -> SteerResult:
        return _build(cls, reply)
