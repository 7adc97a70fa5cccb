"""One table line as segments: padded cells in one row style, without rich layout per cell."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from rich.cells import cell_len, set_cell_size
from rich.console import Console, ConsoleOptions
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from tui.names import ELLIPSIS

Cell = Text | str


class Look(NamedTuple):
    """The styles of one kind of line (header, zebra stripe, cursor, hover)."""

    text: Style  # under each cell's own style
    post: Style | None  # over it: the cursor's colour wins over a cell's
    fill: Style  # padding and the space right of the last column


def first_line(cell: Cell) -> str:
    plain = cell.plain if isinstance(cell, Text) else cell
    return plain.split("\n", 1)[0] if "\n" in plain else plain


def cell_width(cell: Cell) -> int:
    """Cells one line high: only the first line is drawn, so only it is measured."""
    return cell_len(first_line(cell))


class Painter:
    """Draws cells; parsed text styles are cached until the theme changes (`forget`)."""

    def __init__(self, console: Console, options: ConsoleOptions, padding: int = 1) -> None:
        self.console, self.options, self.padding = console, options, padding
        self.styles: dict[str, Style] = {}

    def forget(self) -> None:
        self.styles = {}

    def style(self, style: str | Style) -> Style:
        if not isinstance(style, str):
            return style
        found = self.styles.get(style)
        if found is None:
            found = self.styles[style] = self.console.get_style(style, default=Style.null())
        return found

    def line(self, cells: Sequence[Cell], widths: Sequence[int], look: Look, end: int) -> list[Segment]:
        """Cells in columns of `widths` (padding included) up to cell `end` at least, filled with `look.fill`.

        Neighbours of one style share a segment (padding, a plain cell, the fill), so the line needs no
        simplifying: most rows come out as a few segments.
        """
        texts: list[str] = []
        styles: list[Style] = []

        def add(text: str, style: Style) -> None:
            if styles and (style is styles[-1] or style == styles[-1]):
                texts[-1] += text
            else:
                texts.append(text)
                styles.append(style)

        pad, position = " " * self.padding, 0
        for index, column_width in enumerate(widths):
            if position >= end:
                break  # off screen to the right
            if not column_width:
                continue  # a hidden column
            position += column_width
            cell = cells[index] if index < len(cells) else ""
            inner = max(0, column_width - 2 * self.padding)
            add(pad, look.fill)
            if isinstance(cell, Text) and cell.spans:
                for segment in self.rich(cell, inner, look):
                    add(segment.text, segment.style or look.fill)
            else:
                plain = first_line(cell)
                length = cell_len(plain)
                if length > inner:  # cut; a Text that asks for an ellipsis shows where
                    ellipsis = isinstance(cell, Text) and cell.overflow == "ellipsis" and inner > 0
                    plain = set_cell_size(plain, inner - 1) + ELLIPSIS if ellipsis else set_cell_size(plain, inner)
                    length = inner
                if plain:
                    style = look.text + self.style(cell.style) if isinstance(cell, Text) else look.text
                    add(plain, style + look.post if look.post else style)
                add(" " * (inner - length), look.fill)
            add(pad, look.fill)
        if end > position:
            add(" " * (end - position), look.fill)
        return [Segment(text, style) for text, style in zip(texts, styles, strict=True) if text]

    def rich(self, cell: Text, inner: int, look: Look) -> list[Segment]:
        """A cell with spans, through rich (rare: the console's cells carry one style each)."""
        options = self.options.update_dimensions(inner, 1).update(no_wrap=True)
        line = self.console.render_lines(cell, options, pad=True)[0]
        return list(Segment.apply_style(line, look.text, look.post))
