"""A DataTable that follows a list of keyed rows, updating only the cells that changed."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from tui.rows import Row


class SyncedTable(DataTable):
    """Rows are replaced by key; the cursor stays on the same key across updates."""

    def __init__(self, columns: tuple[str, ...], widths: tuple[int, ...] = (), **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, cell_padding=1, **kwargs)  # type: ignore[arg-type]
        self.column_names, self.widths = columns, widths
        self.shown: list[Row] = []

    def on_mount(self) -> None:
        for index, name in enumerate(self.column_names):
            width = self.widths[index] if index < len(self.widths) else None
            self.add_column(name, key=str(index), width=width)  # fixed widths: no re-measuring on updates

    def sync(self, rows: list[Row]) -> None:
        if [key for key, _ in rows] != [key for key, _ in self.shown]:
            cursor_key = self.cursor_key()
            self.clear()
            for key, cells in rows:
                self.add_row(*map(as_text, cells), key=key)
            if cursor_key is not None and cursor_key in {k for k, _ in rows}:
                self.move_cursor(row=self.get_row_index(cursor_key))
        else:
            for (key, cells), (_, old) in zip(rows, self.shown, strict=False):
                for index, (cell, before) in enumerate(zip(cells, old, strict=False)):
                    if not same(cell, before):
                        self.update_cell(key, str(index), as_text(cell))
        self.shown = rows

    def cursor_key(self) -> str | None:
        if not self.shown or self.cursor_row >= len(self.shown) or self.cursor_row < 0:
            return None
        return self.shown[self.cursor_row][0]


def as_text(cell: Text | str) -> Text:
    """Plain strings as Text: no markup parsing per render."""
    return cell if isinstance(cell, Text) else Text(cell)


def same(a: Text | str, b: Text | str) -> bool:
    if isinstance(a, Text) and isinstance(b, Text):
        return a.plain == b.plain and a.style == b.style
    return a == b
