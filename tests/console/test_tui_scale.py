"""elastic-tui on a 2,048-node fake job: status in pages, only the daemons on screen followed, totals in the header."""

from __future__ import annotations

import pytest
from support.console import SIZE, until
from support.fake import fixed_clock
from support.fake_large import RANKS_PER_NODE, LargeJob

from tui.app import ElasticApp
from tui.paging import PAGE_MARGIN, is_placeholder
from tui.views.ranks import GRID_LINES
from tui.widgets.header import JobHeader

pytestmark = [pytest.mark.quick, pytest.mark.asyncio]


def status_calls(job: LargeJob) -> list[dict[str, int]]:
    return [args for op, args in job.calls if op == "status"]


def shown_pubs(app: ElasticApp) -> set[str]:
    return {f"fake-pub://{node_id}" for node_id in app.session.shown_nodes()}


async def test_a_large_job_is_followed_through_pages_and_the_rows_on_screen() -> None:
    job = LargeJob(2048)
    app = ElasticApp({"big": ["fake://n0000"]}, connect=job.link, clock=fixed_clock, poll_interval_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = app.nodes_table
        await until(pilot, lambda: len(table.keys) == 2048 and len(status_calls(job)) >= 3, what="pages")
        rows = table.scrollable_content_region.height - 1
        coordinator = "fake-pub://n0000"
        await until(pilot, lambda: set(job.subscribed) == shown_pubs(app) | {coordinator}, what="followed")
        assert len(job.subscribed) <= rows + 1
        assert all(args.get("nodes_limit", 2048) <= rows + 2 * PAGE_MARGIN + 128 for args in status_calls(job))
        assert not [op for op, _ in job.calls if op in ("metrics", "workers")]  # 16,384 ranks: never asked
        header = str(app.query_one(JobHeader).shown)
        assert "daemons 2048: 2040 alive/active, 8 alive/standby" in header
        assert is_placeholder(table.keys[-1]) and table.render_line(1).text.split()[0] == "n0000"

        await pilot.press("end")
        await until(pilot, lambda: table.keys[-1] == "n2047", what="the last page")
        assert status_calls(job)[-1]["nodes_offset"] >= 2048 - rows - PAGE_MARGIN
        await until(pilot, lambda: "fake-pub://n2047" in job.subscribed and "fake-pub://n0001" not in job.subscribed,
                    what="re-targeted")
        assert set(job.subscribed) <= shown_pubs(app) | {coordinator}
        app.redraw()
        await pilot.pause()
        last = table.render_line(table.cursor_row - int(table.scroll_y) + 1).text
        assert last.split()[0] == "n2047" and "live" in last

        await pilot.press("colon", *"ranks", "enter")
        await pilot.pause()
        grid = str(app.query_one("#rank-grid").render())
        drawn = 2048 * RANKS_PER_NODE - 8 * RANKS_PER_NODE - GRID_LINES * 16
        assert f"{drawn} more ranks" in grid
