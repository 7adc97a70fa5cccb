"""The console's diagnosis on the fake job: tails through `logs`, the root cause on its row and in its detail."""

from __future__ import annotations

import pytest
from test_tui_support import SIZE, fake_app, screen_text, settle, until
from textual.pilot import Pilot
from textual.widgets import Static

from tui.app import ElasticApp
from tui.diagnosis import RootCause
from tui.fake import ROOT_CAUSE, FakeLink
from tui.screens.node_detail import NodeDetailScreen

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`


def daemon(app: ElasticApp) -> FakeLink:
    """The fake daemon the console asks node queries through."""
    link = app.session.link(app.session.active)
    assert isinstance(link, FakeLink)
    return link


def shown(app: ElasticApp, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


async def open_detail(pilot: Pilot, *keys: str) -> ElasticApp:
    """Node detail of the node under the cursor after `keys`, its tails read."""
    app: ElasticApp = pilot.app  # type: ignore[assignment]
    await settle(pilot)
    await pilot.press(*keys, "enter")
    await until(pilot, lambda: isinstance(app.screen, NodeDetailScreen), what="node detail")
    await until(pilot, lambda: "(pid" in shown(app, "#tails") or "(no output" in shown(app, "#tails"), what="tails")
    return app


@pytest.mark.asyncio
async def test_node_detail_reads_the_tails_through_the_logs_verb() -> None:
    async with fake_app().run_test(size=SIZE) as pilot:
        app = await open_detail(pilot)
        tails = shown(app, "#tails")
        # the fake's log paths exist on no host: these lines came from the node's answer
        assert "── rank 1 (pid 1004, running) ──" in tails and "[rank 1] step 240 loss" in tails
        assert "[rank 0] step 160" not in tails and "[rank 0] step 170" in tails  # the last 8 lines
        assert ("logs", {"node": "a", "tail": 8}) in daemon(app).calls


@pytest.mark.asyncio
async def test_node_detail_says_why_a_node_gives_no_tails() -> None:
    async with fake_app().run_test(size=SIZE) as pilot:
        app = await open_detail(pilot, "down", "down")  # c: a standby, no workers
        assert shown(app, "#tails") == "(no output from node c: node c has no workers in round 2)"
        await pilot.press("escape")
        daemon(app).silent.add("a")
        app = await open_detail(pilot, "up", "up")
        assert shown(app, "#tails") == "(no output from node a: node a did not answer within 4 s)"


@pytest.mark.asyncio
async def test_the_root_cause_shows_on_its_nodes_row_and_in_its_detail() -> None:
    async with fake_app().run_test(size=SIZE) as pilot:
        app: ElasticApp = pilot.app  # type: ignore[assignment]
        await settle(pilot)
        cause = app.nodes_table.column_names.index("cause")
        cells = {key: str(row[cause]) for key, row in app.nodes_table.shown}
        assert cells == {"a": "", "b": "ValueError: bad batch at train.py:42", "c": ""}
        assert "ValueError: bad batch at train.py:" in screen_text(app)  # cut to what the screen leaves it
        app = await open_detail(pilot, "down")
        assert shown(app, "#detail-cause") == ("root cause of round 1: rank 3 on node b: ValueError: bad batch at "
                                               "train.py:42 in step (exit code 1); 1 more failure(s) followed it")


@pytest.mark.asyncio
async def test_the_root_cause_leaves_the_row_once_the_job_moved_on() -> None:
    async with fake_app().run_test(size=SIZE) as pilot:
        app: ElasticApp = pilot.app  # type: ignore[assignment]
        await settle(pilot)
        model = app.model
        assert model.recent_cause("b") is model.root_cause and model.recent_cause("a") is None
        model.job.round = ROOT_CAUSE["round"] + 2  # type: ignore[operator]
        assert model.recent_cause("b") is None and model.recent_cause() is None
        app.redraw()
        table = app.nodes_table
        widths = dict(zip(table.column_names, table.content_widths, strict=True))
        assert widths["cause"] == 0 and widths["trend"] == 10  # the columns it took come back


def test_a_root_cause_without_a_python_error_says_how_the_rank_ended() -> None:
    cause = RootCause.from_body({"node": "b", "rank": 1, "round": 3, "signal": "SIGKILL", "exit_code": -9,
                                 "consequences": 0})
    assert cause is not None and cause.brief == "killed by SIGKILL"
    assert cause.summary == "root cause of round 3: rank 1 on node b: killed by SIGKILL"
    assert RootCause.from_body(None) is None and RootCause.from_body({"rank": 1}) is None
