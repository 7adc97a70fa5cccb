"""The ranks view: the global rank map as a grid coloured by node and state, and past rounds."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from tui.model import JobModel
from tui.rows import Row, history_rows, matches, name_width, node_colour
from tui.views.table import SyncedTable

HISTORY_COLUMNS = ("round", "cause", "world", "members", "recovery timeline (s)")
CELL_NAME = 6  # cells of a node's name in a grid cell
GRID_LINES = 16  # lines of ranks drawn: the grid shows at most 20 lines, so 16,384 ranks cost a screenful


def rank_grid(model: JobModel, per_line: int = 16, width: int = 120) -> Text:
    """One cell per global rank, background = its node, dim when the node is not live; the first
    GRID_LINES lines of them, and a legend of the nodes drawn."""
    text = Text(f"round {model.job.round}: world {model.job.world_size}\n", style="bold")
    short, legend = model.short_names(CELL_NAME), model.short_names(name_width(width))
    every = model.rank_cells()
    cells = every[:GRID_LINES * per_line]
    for index, (rank, node_id) in enumerate(cells):
        node = model.nodes.get(node_id)
        live = model.node_liveness(node) if node else "missing"
        mark = {"live": "", "stale": "?", "missing": "!"}.get(live, "x")
        style = f"black on {node_colour(model, node_id)}" + ("" if live == "live" else " dim strike")
        text.append(f" {rank:>3}{mark:1} {short.get(node_id, node_id):<{CELL_NAME}}", style=style)
        text.append("\n" if (index + 1) % per_line == 0 else " ")
    text.append("\n")
    if len(cells) < len(every):
        text.append(f"… {len(every) - len(cells)} more ranks\n", style="dim")
    drawn = model.nodes if len(cells) == len(every) else dict.fromkeys(node_id for _, node_id in cells)
    for node_id in drawn:
        text.append("■ ", style=node_colour(model, node_id)).append(f"{legend.get(node_id, node_id)}  ")
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

    history: tuple[list[dict[str, Any]], dict[str, str], list[Row]] | None = None

    def show(self, model: JobModel, marks: set[str], pattern: str) -> None:
        width = self.size.width or self.app.size.width
        self.query_one("#rank-grid", Static).update(rank_grid(model, width=width))
        rows = [row for row in self.history_rows(model, model.short_names(name_width(width)))
                if matches(pattern, *row[1])]
        self.query_one("#round-history", SyncedTable).sync(rows)

    def history_rows(self, model: JobModel, names: dict[str, str]) -> list[Row]:
        """Computed again only for new rounds or names: each round's timeline has two phases per node."""
        if self.history is None or self.history[0] is not model.round_history or self.history[1] is not names:
            self.history = (model.round_history, names, history_rows(model, names))
        return self.history[2]
