"""Steering requests built from an action and its targets; dry-run previews and execution. No Textual."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tui.actions import ActionSpec
from tui.model import JobModel
from tui.session import STEER_TIMEOUT_S, JobSession


@dataclass(frozen=True)
class SteerRequest:
    """One verb call: `elasticd <verb> args`."""

    verb: str
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return " ".join([self.verb, *(str(v) for v in self.args.values())])


class NoTarget(ValueError):
    """The action needs a node or rank and none is selected."""


def build_requests(spec: ActionSpec, model: JobModel, nodes: list[str], rank: int | None) -> list[SteerRequest]:
    """The calls an action makes: one per target node, or one for the job."""
    if spec.id in ("scale_up", "scale_down"):
        current = model.job.target or len(model.rank_map)
        return [SteerRequest("scale", {"nodes": current + (1 if spec.id == "scale_up" else -1)})]
    if spec.targets == "nodes":
        if not nodes:
            raise NoTarget(f"{spec.verb}: select a node first (cursor, or mark with space)")
        return [SteerRequest(spec.verb, {"node": node}) for node in nodes]
    if spec.targets == "rank":
        if rank is None or not nodes:
            raise NoTarget(f"{spec.verb}: put the cursor on a node that runs workers")
        return [SteerRequest(spec.verb, {"node": nodes[0], "rank": rank})]
    return [SteerRequest(spec.verb)]


async def preview(session: JobSession, requests: list[SteerRequest], force: bool = False) -> str:
    """The planned effect, from the daemon's dry run; raises ClientError (e.g. code `refused`)."""
    summaries = []
    for request in requests:
        reply = await session.call(request.verb, timeout_s=STEER_TIMEOUT_S, dry_run=True, force=force,
                                   **request.args)
        summaries.append(str((reply.get("plan") or {}).get("summary", "accepted")))
    return "; ".join(summaries)


async def execute(session: JobSession, requests: list[SteerRequest], force: bool = False) -> str:
    results = []
    for request in requests:
        reply = await session.call(request.verb, timeout_s=STEER_TIMEOUT_S, force=force, **request.args)
        summary = (reply.get("plan") or {}).get("summary", "")
        results.append(f"{request.label}: {'accepted' if reply.get('accepted', True) else 'done'}"
                       + (f" ({summary})" if summary else ""))
    return "; ".join(results)
