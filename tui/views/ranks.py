"""The ranks view: the global rank map as a grid coloured by node and state, and past rounds."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from tui.model import JobModel
from tui.rows import node_colour
from tui.views.table import SyncedTable

HISTORY_COLUMNS = ("round", "cause", "world", "members", "recovery timeline (s)")


def rank_grid(model: JobModel, per_line: int = 16) -> Text:
    """One cell per global rank, background = its node, dim when the node is not live."""
    text = Text(f"round {model.job.round}: world {model.job.world_size}\n", style="bold")
    cells = sorted((rank, str(entry.get("node_id"))) for entry in model.rank_map for rank in entry.get("ranks", []))
    for index, (rank, node_id) in enumerate(cells):
        node = model.nodes.get(node_id)
        live = model.node_liveness(node) if node else "missing"
        mark = {"live": "", "stale": "?", "missing": "!"}.get(live, "x")
        style = f"black on {node_colour(model, node_id)}" + ("" if live == "live" else " dim strike")
        text.append(f" {rank:>3}{mark:1} {node_id[:6]:<6}", style=style)
        text.append("\n" if (index + 1) % per_line == 0 else " ")
    text.append("\n")
    for node_id in model.nodes:
        text.append("■ ", style=node_colour(model, node_id)).append(f"{node_id}  ")
    text.append("  (? stale, ! missing)", style="dim")
    return text


class RanksView(Vertical):
    """The grid on top; history of rounds (newest first) below."""

    DEFAULT_CSS = """
    RanksView #rank-grid { height: auto; max-height: 20; padding: 0 1; border-bottom: solid $primary-darken-2; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="rank-grid")
        yield SyncedTable(HISTORY_COLUMNS, id="round-history")

    def show(self, model: JobModel, marks: set[str], pattern: str) -> None:
        from tui.rows import history_rows, matches

        self.query_one("#rank-grid", Static).update(rank_grid(model))
        rows = [row for row in history_rows(model) if matches(pattern, *row[1])]
        self.query_one("#round-history", SyncedTable).sync(rows)
