"""A DataTable that follows a list of keyed rows and redraws only rows whose cells changed.

DataTable keys every render cache on one table-wide update counter, so changing one cell re-renders every
visible cell through rich (Padding, Styled, render_lines): the console's main cost at scale. This table keeps
DataTable for everything but drawing data rows (header, cursor, scrolling, keys, messages, CSS), holds its own
cells, and draws a data row straight into segments with DataTable's own styles, cached per row until that
row's cells (or cursor, hover, zebra or width) change. Rows of a lazy table (`sync_lazy`) are computed only
when they are on screen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual._segment_tools import line_crop
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from tui.rows import Row

Cell = Text | str
Cells = Callable[[str], Sequence[Cell]]


class SyncedTable(DataTable):
    """Rows are replaced by key; the cursor stays on the same key across updates."""

    def __init__(self, columns: tuple[str, ...], widths: tuple[int, ...] = (), **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, cell_padding=1, **kwargs)  # type: ignore[arg-type]
        self.column_names, self.widths = columns, widths
        self.keys: list[str] = []
        self.cells: dict[str, Sequence[Cell]] = {}
        self.versions: dict[str, int] = {}
        self.row_keys: dict[str, RowKey] = {}
        self.cells_of: Cells | None = None
        self.stale: set[str] = set()
        self.strips: dict[str, tuple[tuple[Any, ...], Strip]] = {}
        self.style_epoch: tuple[Any, ...] | None = None
        self.row_style_cache: dict[tuple[int, bool, bool], tuple[list[tuple[Style, Style]], Style, Style]] = {}
        self.text_styles: dict[str, Style] = {}
        self.line_style: Style | None = None

    def on_mount(self) -> None:
        for index, name in enumerate(self.column_names):
            width = self.widths[index] if index < len(self.widths) else None
            self.add_column(name, key=str(index), width=width)  # fixed widths: no re-measuring on updates

    @property
    def shown(self) -> list[Row]:
        return [(key, list(self.cells.get(key, ()))) for key in self.keys]

    # ---- feeding ------------------------------------------------------------------------------------
    def sync(self, rows: list[Row]) -> None:
        """Show exactly these rows."""
        self.cells_of, self.stale = None, set()
        if not self.same_keys([key for key, _ in rows]):
            self.rebuild([key for key, _ in rows], {key: cells for key, cells in rows})
            return
        changed = False
        for key, cells in rows:
            changed = self.put(key, cells) or changed
        if changed:
            self.refresh()

    def sync_lazy(self, keys: list[str], cells_of: Cells) -> None:
        """Show these rows, computing a row's cells (`cells_of(key)`) only while it is on screen."""
        self.cells_of = cells_of
        if not self.same_keys(keys):
            self.rebuild(keys, {})
            return
        visible = self.visible_keys()
        self.stale = set(keys).difference(visible)
        changed = False
        for key in visible:
            changed = self.put(key, cells_of(key)) or changed
        if changed:
            self.refresh()

    def same_keys(self, keys: list[str]) -> bool:
        return keys == self.keys and all(key in self.row_keys for key in keys[:1])

    def rebuild(self, keys: list[str], cells: dict[str, Sequence[Cell]]) -> None:
        cursor_key = self.cursor_key()
        self.clear()
        self.keys, self.cells, self.row_keys, self.strips = list(keys), {}, {}, {}
        self.stale = set(keys) if self.cells_of is not None else set()
        blank = [""] * len(self.column_names)
        for key in keys:
            row = cells.get(key)
            if row is not None:
                self.cells[key] = row
            self.versions[key] = self.versions.get(key, 0) + 1
            self.row_keys[key] = self.add_row(*map(as_text, row if row is not None else blank), key=key)
        if cursor_key is not None and cursor_key in self.row_keys:
            self.move_cursor(row=self.get_row_index(cursor_key))

    def put(self, key: str, cells: Sequence[Cell]) -> bool:
        """Store one row's cells; True when they differ from what is drawn."""
        old = self.cells.get(key)
        if old is not None and len(old) == len(cells) and all(map(same, cells, old)):
            return False
        self.cells[key] = cells
        self.versions[key] = self.versions.get(key, 0) + 1
        data = self._data.get(self.row_keys[key])
        if data is not None:
            for index, cell in enumerate(cells):
                data[ColumnKey(str(index))] = cell
        return True

    def visible_keys(self) -> list[str]:
        top = int(self.scroll_y)
        return self.keys[top:top + max(1, self.size.height)]

    def cursor_key(self) -> str | None:
        if not self.keys or self.cursor_row >= len(self.keys) or self.cursor_row < 0:
            return None
        return self.keys[self.cursor_row]

    # ---- drawing ------------------------------------------------------------------------------------
    def row_cells(self, key: str) -> Sequence[Cell]:
        if key in self.stale and self.cells_of is not None:
            self.stale.discard(key)
            self.put(key, self.cells_of(key))
        return self.cells.get(key, ())

    def render_lines(self, crop: Region) -> list[Strip]:
        self.line_style = self.rich_style  # once a pass, not once a line
        try:
            return super().render_lines(crop)
        finally:
            self.line_style = None

    def render_line(self, y: int) -> Strip:
        if self.fixed_rows or self.line_style is None:
            return super().render_line(y)
        scroll_x, scroll_y = self.scroll_offset
        if y >= (self.header_height if self.show_header else 0):
            y += scroll_y
        return self._render_line(y, scroll_x, scroll_x + self.size.width, self.line_style)

    def _render_line(self, y: int, x1: int, x2: int, base_style: Style) -> Strip:
        width = self.size.width
        try:
            row_key, line_no = self._get_offsets(y)
        except LookupError:
            return Strip.blank(width, base_style)
        key = row_key.value
        if row_key is self._header_row_key or key not in self.row_keys or line_no or self._labelled_row_exists \
                or self.fixed_columns or self.fixed_rows:
            return super()._render_line(y, x1, x2, base_style)
        cells = self.row_cells(key)
        row_index = self._row_locations.get(row_key)
        cursor = self.show_cursor and self.cursor_coordinate.row == row_index
        hover = self._show_hover_cursor and self.hover_coordinate.row == row_index
        widths = tuple(column.get_render_width(self) for column in self.ordered_columns)
        state = (self.versions.get(key), row_index, cursor, hover, self.show_cursor, self._show_hover_cursor,
                 self._pseudo_class_state, base_style, widths, x1, x2, width)
        cached = self.strips.get(key)
        if cached is not None and cached[0] == state:
            return cached[1]
        strip = self.draw_row(row_index, cells, widths, cursor, hover, base_style, x1, x2, width)
        self.strips[key] = (state, strip)
        return strip

    def draw_row(self, row_index: int, cells: Sequence[Cell], widths: tuple[int, ...], cursor: bool, hover: bool,
                 base_style: Style, x1: int, x2: int, width: int) -> Strip:
        """One data row as DataTable would draw it: padded cells in the row's zebra/cursor/hover style."""
        pres, post_style, extend_style = self.row_styles(row_index, cursor, hover, base_style, len(widths))
        padding = self.cell_padding
        pad = " " * padding
        segments: list[Segment] = []
        append = segments.append
        for column_index, column_width in enumerate(widths):
            cell = cells[column_index] if column_index < len(cells) else ""
            pre, pad_style = pres[column_index]
            inner = max(0, column_width - 2 * padding)
            if isinstance(cell, Text):
                if cell.spans:
                    segments += self.draw_rich(cell, inner, padding, pre, pad_style, post_style)
                    continue
                plain, text_style = cell.plain, self.text_style(cell.style)
            else:
                plain, text_style = cell, None
            if "\n" in plain:
                plain = plain.split("\n", 1)[0]
            length = cell_len(plain)
            if length > inner:
                plain, length = set_cell_size(plain, inner), inner
            if padding:
                append(Segment(pad, pad_style))
            if plain:
                style = pre + text_style if text_style is not None else pre
                append(Segment(plain, style + post_style if post_style else style))
            if inner > length:
                append(Segment(" " * (inner - length), pad_style))
            if padding:
                append(Segment(pad, pad_style))
        table_width = sum(widths)
        append(Segment(" " * max(0, width - table_width), extend_style))
        if x1 == 0 and x2 >= max(width, table_width) and table_width <= width:
            return Strip(segments, width).simplify()  # the usual case: no horizontal scroll, nothing to crop
        total = table_width + max(0, width - table_width)
        return Strip(line_crop(segments, x1, x2, total)).adjust_cell_length(width, base_style).simplify()

    def row_styles(self, row_index: int, cursor: bool, hover: bool, base_style: Style,
                   columns: int) -> tuple[list[tuple[Style, Style]], Style, Style]:
        """Per column (cell style, padding style), the post style and the fill style of one row; cached."""
        epoch = (self._pseudo_class_state, base_style, self.show_cursor, self._show_hover_cursor, columns,
                 self.cursor_foreground_priority, self.cursor_background_priority)
        if epoch != self.style_epoch:
            self.style_epoch, self.row_style_cache = epoch, {}
        found = self.row_style_cache.get((row_index, cursor, hover))
        if found is not None:
            return found
        row_style = self._get_row_style(row_index, base_style)
        component_style, post_style = self._get_styles_to_render_cell(
            False, False, False, hover, cursor, self.show_cursor, self._show_hover_cursor,
            self.cursor_foreground_priority == "css", self.cursor_background_priority == "css")
        pres = []
        for column_index in range(columns):
            pre = row_style + Style.from_meta({"row": row_index, "column": column_index}) + component_style
            pres.append((pre, pre + post_style if post_style else pre))
        extend_style, _ = self._get_styles_to_render_cell(
            False, False, False, hover, cursor, self.show_cursor, self._show_hover_cursor, False, False)
        extend_style = row_style + extend_style + Style.from_meta({"row": row_index, "column": 0,
                                                                   "out_of_bounds": True})
        found = self.row_style_cache[(row_index, cursor, hover)] = (pres, post_style, extend_style)
        return found

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self.style_epoch, self.row_style_cache, self.text_styles, self.strips = None, {}, {}, {}

    def draw_rich(self, cell: Text, inner: int, padding: int, pre: Style, pad_style: Style,
                  post_style: Style) -> list[Segment]:
        """A cell with spans, through rich (rare: the console's own cells carry one style each)."""
        options = self.app.console_options.update_dimensions(inner, 1).update(no_wrap=True)
        line = self.app.console.render_lines(cell, options, pad=True)[0]
        pad = [Segment(" " * padding, pad_style)] if padding else []
        return pad + list(Segment.apply_style(line, pre, post_style or None)) + pad

    def text_style(self, style: str | Style) -> Style:
        if not isinstance(style, str):
            return style
        found = self.text_styles.get(style)
        if found is None:
            found = self.text_styles[style] = self.app.console.get_style(style, default=Style.null())
        return found


def as_text(cell: Cell) -> Text:
    """Plain strings as Text: no markup parsing per render."""
    return cell if isinstance(cell, Text) else Text(cell)


def same(a: Cell, b: Cell) -> bool:
    if isinstance(a, Text) and isinstance(b, Text):
        return a.plain == b.plain and a.style == b.style and a.spans == b.spans
    return a == b
