"""The events view: recovery timelines on top, the live (filterable) event log below."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from tui.model import JobModel
from tui.rows import EVENT_COLUMNS, PHASES, event_rows, name_width
from tui.views.table import SyncedTable

PHASE_STYLE = {"rendezvous": "cyan", "stopped": "yellow", "spawned": "magenta", "first_step": "green"}


def recovery_bars(model: JobModel, width: int = 60, last: int = 4) -> Text:
    """Each recent recovery as a bar, detect → rendezvous → stopped → spawned → first_step."""
    text = Text("recoveries (s from detection): ", style="bold")
    text.append("rendezvous ", "cyan").append("stopped ", "yellow").append("spawned ", "magenta")
    text.append("first_step\n", "green")
    recoveries = model.recoveries()[-last:]
    if not recoveries:
        return text.append("none yet", style="dim")
    longest = max(max(map(float, e["timeline"].values()), default=0.0) for e in recoveries) or 1.0
    for event in recoveries:
        timeline = {k: float(v) for k, v in event["timeline"].items()}
        text.append(f"round {event.get('round', '?'):>3} {event.get('cause', '')!s:<10} ")
        done = 0
        for phase in PHASES[1:]:
            if phase in timeline:
                cells = max(done, int(timeline[phase] / longest * width))
                text.append("█" * (cells - done), PHASE_STYLE[phase])
                done = cells
        total = max(timeline.values(), default=0.0)
        text.append(" " * (width - done) + f" {total:.2f}s\n")
    text.rstrip()
    return text


class EventsView(Vertical):
    """`/` filters the log by regex; `!` in front inverts."""

    DEFAULT_CSS = """
    EventsView #recoveries { height: auto; max-height: 6; padding: 0 1; border-bottom: solid $primary-darken-2; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="recoveries")
        yield SyncedTable(EVENT_COLUMNS, id="event-log")

    def show(self, model: JobModel, marks: set[str], pattern: str) -> None:
        self.query_one("#recoveries", Static).update(recovery_bars(model))
        log = self.query_one("#event-log", SyncedTable)
        log.sync(event_rows(model, model.short_names(name_width(log.size.width or self.app.size.width)), pattern))
