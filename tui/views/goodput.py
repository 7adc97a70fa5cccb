"""The goodput view: the job's lost time by cause over time (stacked bars), then `elasticd goodput`'s own table."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static
from textual_plotext import PlotextPlot

from elasticd.commands.verbs.goodput import COMMANDS, render
from elasticd.wire.protocol import ProtocolError
from tui.model import JobModel

LOST_FIRST = ("checkpoint", "redone", "waiting")  # then recovery by reason, as the ledger names it
TICKS = 6  # time labels under the bars


def lost_series(report: dict[str, Any]) -> tuple[list[float], dict[str, list[float]]]:
    """Where each of the timeline's slices ends, in seconds before the last one ends (negative), and per cause the
    seconds lost in each slice."""
    timeline = report.get("timeline") or {}
    bins: list[dict[str, float]] = list(timeline.get("bins") or [])
    width, start = float(timeline.get("width_s") or 1.0), float(timeline.get("start") or 0.0)
    end = start + width * len(bins)
    causes = sorted({k for b in bins for k in b if k != "training"},
                    key=lambda k: (LOST_FIRST.index(k) if k in LOST_FIRST else len(LOST_FIRST), k))
    xs = [round(start + width * (i + 1) - end, 1) for i in range(len(bins))]
    return xs, {c.removeprefix("recovery."): [b.get(c, 0.0) for b in bins] for c in causes}


def ago(seconds: float) -> str:
    seconds = abs(seconds)
    return "now" if seconds < 0.5 else f"-{seconds / 60:.0f}m" if seconds >= 120 else f"-{seconds:.0f}s"


class GoodputView(Vertical):
    """The plot above, the table below; both from the `goodput` reply the console polls every 5 s."""

    def __init__(self) -> None:
        super().__init__(id="goodput")
        self.drawn: object = None

    def compose(self) -> ComposeResult:
        yield PlotextPlot(id="goodput-plot")
        with VerticalScroll(id="goodput-text"):
            yield Static(id="goodput-table")

    def show(self, model: JobModel, marks: set[str], pattern: str) -> None:
        report = model.goodput
        if report is self.drawn:
            return
        self.drawn = report
        table = self.query_one("#goodput-table", Static)
        if not report or "life" not in report:
            table.update(str(report.get("unavailable", "waiting for the coordinator's goodput…")))
            return
        try:
            table.update(render(COMMANDS[0].answer(report)))  # the reply's record, as the CLI reads it
        except ProtocolError as err:  # a daemon of another version: said, and the plot still drawn from what is read
            table.update(f"goodput reply unreadable: {err.reason}")
        plot = self.query_one(PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        xs, lost = lost_series(report)
        width = (report.get("timeline") or {}).get("width_s", 0)
        share = report.get("goodput")
        said = f"goodput {share:.1%} of rank time; " if isinstance(share, float) else ""
        plt.title(f"{said}seconds lost per {width:g} s, by cause" if any(sum(v) for v in lost.values())
                  else f"{said}no time lost in this window")
        if lost and xs:  # textual-plotext's stub says `label`; plotext's stacked_bar takes `labels`
            plt.stacked_bar(xs, list(lost.values()), labels=list(lost),  # type: ignore[call-arg]
                            width=0.8 * (xs[1] - xs[0] if xs[1:] else 1))
        if xs:
            ticks = xs[::-max(1, len(xs) // TICKS)][::-1]  # counted back from now, so `now` is one
            plt.xticks(ticks, [ago(x) for x in ticks])
        plt.ylabel("s lost")
        plot.refresh()
