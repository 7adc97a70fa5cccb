"""The nodes view (default): one row per daemon with health, progress and resources."""

from __future__ import annotations

from tui.model import JobModel
from tui.rows import NODE_COLUMNS, NODE_WIDTHS, node_cells, node_keys, node_rows
from tui.views.table import SyncedTable


class NodesView(SyncedTable):
    """Enter opens a node; space marks it as a target of drain and cordon."""

    def __init__(self) -> None:
        super().__init__(NODE_COLUMNS, NODE_WIDTHS, id="nodes")

    def show(self, model: JobModel, marks: set[str], pattern: str) -> None:
        if pattern:  # the filter looks at every cell of every node
            self.sync(node_rows(model, marks, pattern))
        else:  # hundreds of nodes: only the rows on screen are computed and drawn
            self.sync_lazy(node_keys(model), node_cells(model, marks))
