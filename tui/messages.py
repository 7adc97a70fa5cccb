"""Messages the I/O workers post to the app; telemetry collapses so a burst costs one redraw."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from tui.steering import SteerRequest


@dataclass
class ModelChanged(Message):
    """A job model took new data; pending ones for the same job are replaced, not queued."""

    job_id: str

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ModelChanged) and message.job_id == self.job_id


@dataclass
class PlanReady(Message):
    """A dry run answered: the effect to confirm, or the interlock that refused it."""

    action_id: str
    requests: list[SteerRequest]
    effect: str
    refused: str = ""
    force: bool = False


@dataclass
class SteerDone(Message):
    """A steering call returned (accepted) or failed."""

    action_id: str
    text: str
    ok: bool
