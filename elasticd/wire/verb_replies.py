"""Control replies (docs/protocol.md §4, §5): the error any reply may be, `hello`'s, and the steering verbs'."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elasticd.wire.record import Record


@dataclass(frozen=True, kw_only=True)
class ErrorReply(Record):
    """`ok: false`: why a request was not served. Branch on `errno` or `code`, never on `reason`."""

    ok: bool = False
    errno: int = 0
    code: str = "error"
    reason: str = ""

    @classmethod
    def of(cls, body: Mapping[str, object]) -> ErrorReply | None:
        """The error a reply body is, decoded once (bad_message when malformed); None for a served request."""
        return cls.decode(body, "error reply") if not served(body) else None


def served(body: Mapping[str, object]) -> bool:
    """Whether a reply body answers its request (`ok` is not false)."""
    return body.get("ok") is not False


@dataclass(frozen=True, kw_only=True)
class Hello(Record):
    """`hello`'s reply: what the daemon is, where it listens, and which verbs and features it has."""

    ok: bool = True
    version: str
    protocol: int
    capabilities: list[str]
    node: str
    job_id: str
    coordinator: bool  # this daemon is the coordinator
    rendezvous: str  # host:port of the coordinator mesh
    control: str
    pub: str
    events_pub: str = ""  # the coordinator's PUB, where the job's events are ("" until a member is welcomed)
    stats: dict[str, int] = field(default_factory=dict)  # this daemon's control counters


@dataclass(frozen=True, kw_only=True)
class Answer(Record):
    """A verb's answer whose fields that do not apply are left None, and not sent."""

    def encode(self) -> dict[str, Any]:
        return {name: value for name, value in super().encode().items() if value is not None}


@dataclass(frozen=True, kw_only=True)
class Plan(Answer):
    """What a steering verb does (§5, "Plans"): one line; for a change of members, the world's change as well."""

    summary: str
    world_before: int | None = None
    world_after: int | None = None
    nodes_after: list[str] | None = None  # the next round's members, in group-rank order
    ranks_leaving: list[int] | None = None
    ranks_moving: dict[str, list[list[int]]] | None = None  # node -> [old ranks, new ranks]
    stragglers: dict[str, dict[str, float]] | None = None  # the stragglers it lets go, with their figures
    gain_s_per_step: float | None = None  # the wait per step their peers no longer have


@dataclass(frozen=True, kw_only=True)
class Steered(Answer):
    """A steering verb's reply: a dry run's plan, or the change with its plan (`accepted`: it goes on in events,
    `op_id` names them; neither: done at once)."""

    ok: bool = True
    dry_run: bool | None = None
    accepted: bool | None = None
    op_id: str | None = None
    plan: Plan | None = None
