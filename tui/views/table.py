"""A table on Textual's Line API that follows keyed rows and redraws only the rows whose cells changed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size, Spacing
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tui.rows import Row
from tui.views.paint import Cell, Look, Painter, cell_width

Cells = Callable[[str], Sequence[Cell]]
HEADER = 1  # lines
PADDING = 1  # cells each side of a column


class RowMessage(Message):
    """About the row `key`, at `cursor_row`."""

    def __init__(self, table: SyncedTable, cursor_row: int, key: str) -> None:
        super().__init__()
        self.table, self.cursor_row, self.key = table, cursor_row, key

    @property
    def control(self) -> SyncedTable:
        return self.table


class SyncedTable(ScrollView, can_focus=True):
    """Rows are replaced by key; the cursor stays on the same key across updates.

    Each drawn row is kept as a Strip until its cells, its cursor or hover state, or the table's look (styles,
    focus, column widths, width, horizontal scroll) change. Rows of a lazy table (`sync_lazy`) are computed only
    when they are on screen, so an update costs the rows shown whatever the row count.
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "table--header", "table--cursor", "table--hover", "table--even-row", "table--odd-row"}
    DEFAULT_CSS = """
    SyncedTable {
        background: $surface;
        color: $foreground;
        height: auto;
        max-height: 100%;
        &:focus {
            background-tint: $foreground 5%;
            & > .table--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
            & > .table--header { background-tint: $foreground 5%; }
        }
        &:dark > .table--even-row { background: $surface-darken-1 40%; }
        & > .table--header { text-style: bold; background: $panel; color: $foreground; }
        &:ansi > .table--header { background: ansi_bright_blue; color: ansi_default; }
        & > .table--even-row { background: $surface-lighten-1 50%; }
        & > .table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        & > .table--hover { background: $block-hover-background; }
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Select", show=False),
        Binding("up", "cursor_by(-1)", "Cursor up", show=False),
        Binding("down", "cursor_by(1)", "Cursor down", show=False),
        Binding("pageup", "cursor_page(-1)", "Page up", show=False),
        Binding("pagedown", "cursor_page(1)", "Page down", show=False),
        Binding("home,ctrl+home", "cursor_to(0)", "First row", show=False),
        Binding("end,ctrl+end", "cursor_to(-1)", "Last row", show=False),
    ]

    class RowHighlighted(RowMessage):
        """The cursor is on another row."""

    class RowSelected(RowMessage):
        """Enter, or a click on the cursor's row."""

    def __init__(self, columns: tuple[str, ...], widths: tuple[int, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.column_names, self.widths = columns, widths
        self.labels = [Text.from_markup(name) for name in columns]
        # Columns without a given width grow to their widest cell and never shrink: no jitter as values change.
        self.content_widths = [widths[i] if i < len(widths) else cell_len(label.plain)
                               for i, label in enumerate(self.labels)]
        self.keys: list[str] = []
        self.index: dict[str, int] = {}
        self.cells: dict[str, Sequence[Cell]] = {}
        self.cells_of: Cells | None = None
        self.generation = 0  # +1 per lazy update: a row computed in an older one is computed again when shown
        self.computed: dict[str, int] = {}  # key -> the generation its cells were computed in
        self.cursor_row, self.hover_row = 0, -1
        self.highlighted: str | None = None
        self.strips: dict[str, tuple[tuple[int, bool, bool], Strip]] = {}
        self.header: Strip | None = None
        self.epoch: tuple[Any, ...] | None = None
        self.painter: Painter | None = None

    @property
    def shown(self) -> list[Row]:
        return [(key, list(self.cells.get(key, ()))) for key in self.keys]

    @property
    def column_widths(self) -> list[int]:
        """Cells per column, padding included; a column of width 0 is hidden."""
        return [width + 2 * PADDING if width else 0 for width in self.content_widths]

    def fit(self, widths: Sequence[int]) -> None:
        """New fixed widths for the first columns (0 hides one): the view fits them to the screen."""
        if tuple(widths) == self.widths:
            return
        self.widths = tuple(widths)
        self.content_widths[:len(widths)] = widths
        self.virtual_size = Size(sum(self.column_widths), HEADER + len(self.keys))
        self.refresh()  # the epoch (column widths) changed: every strip is drawn again

    # ---- feeding ------------------------------------------------------------------------------------
    def sync(self, rows: list[Row]) -> None:
        """Show exactly these rows."""
        self.cells_of = None
        keys = [key for key, _ in rows]
        if keys != self.keys:
            self.rebuild(keys, dict(rows))
            return
        self.redraw([key for key, cells in rows if self.put(key, cells)])

    def sync_lazy(self, keys: list[str], cells_of: Cells) -> None:
        """Show these rows, computing a row's cells (`cells_of(key)`) only while it is on screen.

        `keys` is kept, not copied: the same list again (the model caches it) costs no comparison.
        """
        self.cells_of = cells_of
        self.generation += 1
        if keys is not self.keys and keys != self.keys:
            self.rebuild(keys, {})
            return
        self.redraw([key for key in self.visible_keys() if self.compute(key)])

    def rebuild(self, keys: list[str], cells: dict[str, Sequence[Cell]]) -> None:
        """New keys or a new order: everything is redrawn; the cursor follows its key."""
        cursor_key = self.cursor_key()
        self.keys, self.index, self.cells, self.strips = keys, {k: i for i, k in enumerate(keys)}, {}, {}
        self.computed = {}
        for key, row_cells in cells.items():
            self.put(key, row_cells)
        self.virtual_size = Size(sum(self.column_widths), HEADER + len(keys))
        row = self.index.get(cursor_key, self.cursor_row) if cursor_key is not None else 0
        self.move_cursor(row=row, scroll=row != self.cursor_row)
        self.refresh()

    def put(self, key: str, cells: Sequence[Cell]) -> bool:
        """Store one row's cells; True when they differ from what is drawn."""
        old = self.cells.get(key)
        if old is not None and len(old) == len(cells) and all(map(same, cells, old)):
            return False
        self.cells[key] = cells
        self.strips.pop(key, None)
        for index, cell in enumerate(cells[:len(self.content_widths)]):
            if index >= len(self.widths) and cell_width(cell) > self.content_widths[index]:
                self.content_widths[index] = cell_width(cell)
                self.virtual_size = Size(sum(self.column_widths), HEADER + len(self.keys))
        return True

    def redraw(self, keys: list[str]) -> None:
        for key in keys:
            self.refresh_line(HEADER + self.index[key])

    def visible_keys(self) -> list[str]:
        top = int(self.scroll_y)
        return self.keys[top:top + max(1, self.size.height)]

    def cursor_key(self) -> str | None:
        return self.keys[self.cursor_row] if 0 <= self.cursor_row < len(self.keys) else None

    # ---- cursor, keys and mouse ---------------------------------------------------------------------
    def move_cursor(self, *, row: int, animate: bool = False, scroll: bool = True) -> None:
        old, self.cursor_row = self.cursor_row, max(0, min(row, len(self.keys) - 1))
        self.refresh_line(HEADER + old)
        self.refresh_line(HEADER + self.cursor_row)
        if scroll:
            self.call_after_refresh(self.scroll_to_cursor, animate)
        key = self.cursor_key()
        if key is not None and key != self.highlighted:
            self.highlighted = key
            self.post_message(self.RowHighlighted(self, self.cursor_row, key))

    def scroll_to_cursor(self, animate: bool = False) -> None:
        region = Region(int(self.scroll_x), HEADER + self.cursor_row, self.size.width, 1)
        self.scroll_to_region(region, spacing=Spacing(top=HEADER), animate=animate, force=True)

    def set_hover(self, row: int) -> None:
        if row != self.hover_row:
            self.refresh_line(HEADER + self.hover_row)
            self.refresh_line(HEADER + row)
            self.hover_row = row

    def keyboard(self, row: int) -> None:
        """Keys move the cursor and hide the mouse's hover, as in DataTable."""
        self.set_hover(-1)
        self.move_cursor(row=row)

    def action_cursor_by(self, rows: int) -> None:
        self.keyboard(self.cursor_row + rows)

    def action_cursor_page(self, pages: int) -> None:
        self.keyboard(self.cursor_row + pages * max(1, self.scrollable_content_region.height - HEADER))

    def action_cursor_to(self, row: int) -> None:
        self.keyboard(row if row >= 0 else len(self.keys) - 1)

    def action_select_cursor(self) -> None:
        key = self.cursor_key()
        if key is not None:
            self.post_message(self.RowSelected(self, self.cursor_row, key))

    def row_at(self, event: events.MouseEvent) -> int:
        """The row under the mouse, or -1 (header, empty space, outside)."""
        offset = event.get_content_offset(self)
        if offset is None or offset.y < HEADER:
            return -1
        row = offset.y - HEADER + int(self.scroll_y)
        return row if row < len(self.keys) else -1

    def on_mouse_move(self, event: events.MouseMove) -> None:
        self.set_hover(self.row_at(event))

    def on_leave(self, _: events.Leave) -> None:
        self.set_hover(-1)

    def on_click(self, event: events.Click) -> None:
        row = self.row_at(event)
        if row < 0:
            return
        event.stop()
        if row == self.cursor_row:
            self.action_select_cursor()
        else:
            self.move_cursor(row=row, animate=True)

    # ---- drawing ------------------------------------------------------------------------------------
    def notify_style_update(self) -> None:
        super().notify_style_update()
        self.epoch = None
        if self.painter is not None:
            self.painter.forget()
        self.refresh()

    def render_lines(self, crop: Region) -> list[Strip]:
        epoch = (self.rich_style, self.has_focus, tuple(self.content_widths), int(self.scroll_x), self.size.width)
        if epoch != self.epoch:  # the look changed: no strip drawn before is right any more
            self.epoch, self.strips, self.header = epoch, {}, None
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        if y < HEADER:
            if self.header is None:
                self.header = self.draw(self.labels, self.get_component_rich_style("table--header"), Style(), None)
            return self.header
        row = y - HEADER + int(self.scroll_y)
        if row >= len(self.keys):
            return Strip.blank(self.size.width, self.rich_style)
        key = self.keys[row]
        cells = self.row_cells(key)  # a lazy row computed now drops its strip if its cells changed
        state = (row, row == self.cursor_row, row == self.hover_row)
        cached = self.strips.get(key)
        if cached is not None and cached[0] == state:
            return cached[1]
        strip = self.draw(cells, *self.row_look(*state))
        self.strips[key] = (state, strip)
        return strip

    def compute(self, key: str) -> bool:
        """A lazy row's cells, unless this update computed them already; True when they changed."""
        if self.cells_of is None or self.computed.get(key) == self.generation:
            return False
        self.computed[key] = self.generation
        return self.put(key, self.cells_of(key))

    def row_cells(self, key: str) -> Sequence[Cell]:
        self.compute(key)
        return self.cells.get(key, ())

    def row_look(self, row: int, cursor: bool, hover: bool) -> tuple[Style, Style, Style | None]:
        """(row style, cursor/hover style, post style) as DataTable composes them."""
        get = self.get_component_rich_style
        base = get("table--odd-row" if row % 2 else "table--even-row")
        over = Style()
        if hover:
            over += get("table--hover")
        if cursor:
            over += get("table--cursor")
        return base, over, Style.from_color(color=over.color) if over.color else None

    def draw(self, cells: Sequence[Cell], base: Style, over: Style, post: Style | None) -> Strip:
        if self.painter is None:
            self.painter = Painter(self.app.console, self.app.console_options, PADDING)
        text = base + over
        look = Look(text, post, text + post if post else text)
        width, x = self.size.width, int(self.scroll_x)
        segments = self.painter.line(cells, self.column_widths, look, x + width)  # filled up to x + width at least
        return Strip(segments).crop(x, x + width)


def same(a: Cell, b: Cell) -> bool:
    if isinstance(a, Text) and isinstance(b, Text):
        return a.plain == b.plain and a.style == b.style and a.spans == b.spans
    return a == b
