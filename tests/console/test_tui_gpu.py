"""The node detail's GPU table: each worker's GPU fields when its daemon has NVML, no table at all without."""

from __future__ import annotations

import pytest
from support.console import fake_app, settle, until

from tui.rows import Row
from tui.screens.node_detail import NodeDetailScreen
from tui.views.table import SyncedTable

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`


async def gpu_table(gpu: bool) -> tuple[bool, list[Row]]:
    """Whether node a's detail shows its GPU table, and the table's rows."""
    app = fake_app(gpu=gpu)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("enter")  # node a, under the cursor
        await until(pilot, lambda: isinstance(app.screen, NodeDetailScreen), what="the node detail")
        await pilot.pause()
        workers, table = (app.screen.query_one(f"#{name}", SyncedTable) for name in ("workers", "gpus"))
        await until(pilot, lambda: len(workers.shown) == 2 and len(table.shown) == (2 if gpu else 0), what="rows")
        return bool(table.display), table.shown


@pytest.mark.asyncio
async def test_node_detail_shows_each_workers_gpu() -> None:
    shown, rows = await gpu_table(gpu=True)
    assert shown
    assert [[str(cell) for cell in cells] for _, cells in rows] == [
        ["0", "0", "90", "24.0G", "30.0G/80.0G", "60C", "300W"],
        ["1", "1", "85", "25.0G", "31.0G/80.0G", "61C", "290W"]]


@pytest.mark.asyncio
async def test_node_detail_without_nvml_has_no_gpu_table() -> None:
    shown, rows = await gpu_table(gpu=False)
    assert not shown and rows == []
