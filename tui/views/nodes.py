"""The nodes view (default): one row per daemon with health, progress and resources."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message

from tui.model import JobModel
from tui.rows import NAME_MIN, NODE_COLUMNS, NODE_WIDTHS, Names, node_cells, node_keys, node_rows
from tui.views.table import HEADER, PADDING, SyncedTable

NAME_COLUMN = NODE_COLUMNS.index("node")
CAUSE_COLUMN = NODE_COLUMNS.index("cause")
OPTIONAL_COLUMNS = ("host", "rss", "cpu%", "trend", "rst")  # hidden in this order when names or a cause need room
CAUSE_MIN, CAUSE_MAX = 16, 40  # a root cause's cell (node detail shows the whole line)


def column_widths(width: int, longest: int, cause: int = 0) -> list[int]:
    """Content widths of the columns in `width` cells: the node column takes what is left, up to the longest
    name; optional columns give way before a name is cut under NAME_MIN. A root cause of `cause` cells takes
    the room of more optional columns, never a name's (the row's identity), and is cut to what they free."""
    widths = list(NODE_WIDTHS)
    least = max(len("node"), min(longest, NAME_MIN))

    def others() -> int:
        return sum(w + 2 * PADDING for i, w in enumerate(widths) if w and i != NAME_COLUMN)

    def make_room(name: int) -> int:
        """Hide optional columns until a name of `name` cells fits; how many cells the columns still lack."""
        for column in OPTIONAL_COLUMNS:
            if others() + name + 2 * PADDING <= width:
                break
            widths[NODE_COLUMNS.index(column)] = 0
        return max(0, others() + name + 2 * PADDING - width)

    make_room(least)
    widths[NAME_COLUMN] = max(least, min(longest, width - others() - 2 * PADDING))
    if cause:
        widths[CAUSE_COLUMN] = min(cause, CAUSE_MAX)
        widths[CAUSE_COLUMN] = max(CAUSE_MIN, widths[CAUSE_COLUMN] - make_room(widths[NAME_COLUMN]))
    return widths


class NodesView(SyncedTable):
    """Enter opens a node; space marks it as a target of drain and cordon."""

    @dataclass
    class RowsShown(Message):
        """The rows on screen moved (scroll, resize): a paged job fetches and follows those."""

        first: int
        count: int

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, NodesView.RowsShown)

    def __init__(self) -> None:
        super().__init__(NODE_COLUMNS, NODE_WIDTHS, id="nodes")
        self.fitted: tuple[tuple[int, int, int, int], Names] = ((0, -1, -1, 0), {})
        self.last: tuple[JobModel, set[str], str] | None = None
        self.rows_shown = (0, 0)

    def names(self, model: JobModel) -> Names:
        """Fit the columns to the width; names are cut again only when a node joins, the width changes or a root
        cause comes or goes."""
        width = self.scrollable_content_region.width or self.app.size.width
        cause = model.recent_cause()
        cause_width = len(cause.brief) if cause is not None else 0
        key = (id(model), len(model.nodes), width, cause_width)  # another job (`]`) is another model
        if key != self.fitted[0]:
            widths = column_widths(width, max(map(len, model.nodes), default=0), cause_width)
            names = model.short_names(widths[NAME_COLUMN])
            widths[NAME_COLUMN] = max([widths[NAME_COLUMN], *map(len, names.values())])  # grown to stay distinct
            self.fit(widths)
            self.fitted = (key, names)
        return self.fitted[1]

    def show(self, model: JobModel, marks: set[str], pattern: str) -> None:
        self.last = (model, marks, pattern)
        names = self.names(model)
        if pattern:  # the filter looks at every cell of every node
            self.sync(node_rows(model, marks, names, pattern))
        else:  # hundreds of nodes: only the rows on screen are computed and drawn
            self.sync_lazy(node_keys(model), node_cells(model, marks, names))
        self.announce_rows()

    def announce_rows(self) -> None:
        shown = (int(self.scroll_y), max(1, self.scrollable_content_region.height - HEADER))
        if shown != self.rows_shown:
            self.rows_shown = shown
            self.post_message(self.RowsShown(*shown))

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        self.announce_rows()

    def on_resize(self, _: events.Resize) -> None:
        if self.last is not None:
            self.show(*self.last)
