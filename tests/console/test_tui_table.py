"""SyncedTable on its own: the cursor follows its key, lazy rows, per-row redraws, keys and selection."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.app import App, ComposeResult

from tui.views.table import SyncedTable

pytestmark = [pytest.mark.quick, pytest.mark.asyncio]
KEYS = [f"k{i}" for i in range(100)]


class TableApp(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.selected: list[str] = []

    def compose(self) -> ComposeResult:
        yield SyncedTable(("key", "value", "note"), (4, 6))

    def on_synced_table_row_selected(self, message: SyncedTable.RowSelected) -> None:
        self.selected.append(message.key)


def rows(changed: str = "") -> list[tuple[str, list[Text | str]]]:
    return [(key, [key, Text("new" if key == changed else "old", style="bold"), "n"]) for key in KEYS[:20]]


async def test_lazy_rows_are_computed_on_screen_only() -> None:
    asked: list[str] = []
    app = TableApp()
    async with app.run_test(size=(40, 12)) as pilot:
        table = app.query_one(SyncedTable)
        table.sync_lazy(KEYS, lambda key: asked.append(key) or [key, "v", "n"])
        await pilot.pause()
        assert 0 < len(asked) <= 12 and table.render_line(1).text.startswith(" k0 ")
        await pilot.press("end")
        await pilot.pause()
        assert table.cursor_key() == "k99" and "k99" in asked and len(asked) <= 24


async def test_one_changed_row_is_redrawn_and_the_cursor_keeps_its_key() -> None:
    app = TableApp()
    async with app.run_test(size=(40, 12)) as pilot:
        table = app.query_one(SyncedTable)
        table.sync(rows())
        await pilot.pause()
        before = {key: strip for key, (_, strip) in table.strips.items()}
        table.sync(rows(changed="k3"))
        await pilot.pause()
        assert [key for key, (_, strip) in table.strips.items() if before.get(key) is not strip] == ["k3"]
        assert "new" in table.render_line(1 + 3).text
        await pilot.press("down", "down", "enter")
        table.sync(list(reversed(rows())))
        await pilot.pause()
        assert app.selected == ["k2"] and table.cursor_key() == "k2" and table.cursor_row == 17
        await pilot.press("home", "pagedown")
        assert table.cursor_row == 11  # a page: 12 lines less the header
