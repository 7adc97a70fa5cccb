"""The console's diagnosis on the fake job: tails and followed output through `logs`, stacks, the root cause."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from support.console import SIZE, daemon, fake_app, screen_text, settle, until
from support.fake import ROOT_CAUSE
from textual.pilot import Pilot
from textual.widgets import RichLog, Static

from tui.app import ElasticApp
from tui.diagnosis import RootCause
from tui.screens.help import help_table
from tui.screens.node_detail import NodeDetailScreen
from tui.screens.rank_output import RankOutputScreen
from tui.screens.stacks import StacksScreen

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`


def shown(app: ElasticApp, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


def output_lines(app: ElasticApp) -> list[str]:
    return [strip.text.rstrip() for strip in app.screen.query_one(RichLog).lines]


async def open_detail(pilot: Pilot, *keys: str) -> ElasticApp:
    """Node detail of the node under the cursor after `keys`, its tails read."""
    app: ElasticApp = pilot.app  # type: ignore[assignment]
    await settle(pilot)
    await pilot.press(*keys, "enter")
    await until(pilot, lambda: isinstance(app.screen, NodeDetailScreen), what="node detail")
    await until(pilot, lambda: "(pid" in shown(app, "#tails") or "(no output" in shown(app, "#tails"), what="tails")
    return app


async def follow_rank_1(pilot: Pilot) -> ElasticApp:
    """Rank 1's output, opened from node a's detail with the cursor on its second worker."""
    app = await open_detail(pilot)
    await pilot.press("down", "f")
    await until(pilot, lambda: isinstance(app.screen, RankOutputScreen), what="the output view")
    await until(pilot, lambda: output_lines(app)[-1:] == ["[rank 1] step 240 loss 0.3615"], what="the first lines")
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
        daemon(app).silence("a")
        app = await open_detail(pilot, "up", "up")
        assert shown(app, "#tails") == "(no output from node a: node a did not answer within 4 s)"


@pytest.mark.asyncio
async def test_the_output_view_appends_what_the_rank_writes_next() -> None:
    async with fake_app().run_test(size=SIZE) as pilot:
        app = await follow_rank_1(pilot)
        first = output_lines(app)
        assert first[0] == "[rank 1] step 160 loss 0.4597" and len(first) == 9
        link = daemon(app)
        link.printed[1] += ["[rank 1] step 250 loss 0.3500", "[rank 1] step 260 loss 0.3400"]
        await until(pilot, lambda: len(output_lines(app)) == 11, what="the new lines")
        assert output_lines(app) == [*first, "[rank 1] step 250 loss 0.3500", "[rank 1] step 260 loss 0.3400"]
        follows = [args for op, args in link.calls if op == "logs" and "since" in args]
        assert follows[0] == {"node": "a", "rank": 1, "round": 2, "since": len("".join(f"{line}\n" for line in first))}
        assert "rank 1 (pid 1004, running) on node a · round 2" in shown(app, "#output-title")


@pytest.mark.asyncio
async def test_the_output_view_goes_on_past_one_unanswered_read() -> None:
    """A loaded node that misses one read's deadline: the view says so and shows what it wrote meanwhile."""
    async with fake_app().run_test(size=SIZE) as pilot:
        app = await follow_rank_1(pilot)
        link = daemon(app)
        link.silence("a", 2)  # two reads in a row time out, then node a answers again
        link.printed[1].append("[rank 1] step 250 loss 0.3500")
        await until(pilot, lambda: output_lines(app)[-1] == "[rank 1] step 250 loss 0.3500", what="the next line")
        assert output_lines(app)[-2] == "(node a did not answer within 4 s; still following)"
        assert not any(line.startswith("(no longer following") for line in output_lines(app))


@pytest.mark.asyncio
async def test_the_output_view_says_how_much_a_slow_reader_skipped() -> None:
    async with fake_app().run_test(size=SIZE) as pilot:
        app = await follow_rank_1(pilot)
        link = daemon(app)
        link.printed[1] += ["x" * 99, "[rank 1] step 250 loss 0.3500"]
        link.skip = 100
        await until(pilot, lambda: "[rank 1] step 250 loss 0.3500" in output_lines(app), what="the line after")
        assert output_lines(app)[-2:] == [
            "(… 100 bytes skipped: the output ran faster than this console reads …)", "[rank 1] step 250 loss 0.3500"]


@pytest.mark.asyncio
async def test_the_output_view_stops_when_the_node_stops_answering() -> None:
    async with fake_app().run_test(size=SIZE) as pilot:
        app = await follow_rank_1(pilot)
        link = daemon(app)
        link.silence("a")
        await until(pilot, lambda: output_lines(app)[-1].startswith("(no longer following"), what="the message")
        assert output_lines(app)[-3:] == ["(node a did not answer within 4 s; still following)"] * 2 + [
            "(no longer following: node a did not answer within 4 s)"]  # a third silence in a row ends it
        asked = len(link.calls)
        await pilot.pause(0.6)  # two polls' time
        assert not [args for op, args in link.calls[asked:] if op == "logs"]  # node detail's tails wait under it too
        await pilot.press("escape")
        assert isinstance(app.screen, NodeDetailScreen)


@pytest.mark.asyncio
async def test_stacks_of_the_node_and_of_the_followed_rank() -> None:
    async with fake_app().run_test(size=SIZE) as pilot:
        app = await open_detail(pilot)
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, StacksScreen) and "taking" not in shown(app, "#stacks"))
        dumps = shown(app, "#stacks")
        assert "── rank 0 (pid 1003) at train.py:17 in step ──" in dumps and "rank 1 (pid 1004) at train.py:18" in dumps
        await pilot.press("escape", "down", "f")
        await until(pilot, lambda: isinstance(app.screen, RankOutputScreen))
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, StacksScreen) and "taking" not in shown(app, "#stacks"))
        assert "at train.py:18 in step" in shown(app, "#stacks") and "rank 0" not in shown(app, "#stacks")
        assert ("stacks", {"node": "a", "rank": 1}) in daemon(app).calls


@pytest.mark.asyncio
async def test_output_from_the_nodes_view_follows_the_nodes_first_rank() -> None:
    async with fake_app().run_test(size=SIZE) as pilot:
        app: ElasticApp = pilot.app  # type: ignore[assignment]
        await settle(pilot)
        await pilot.press("down", "f")
        await until(pilot, lambda: isinstance(app.screen, RankOutputScreen))
        assert (app.screen.node_id, app.screen.rank) == ("b", 2)  # type: ignore[attr-defined]
        await pilot.press("escape", "down", "f")  # c runs no rank: nothing to follow
        await pilot.pause()
        assert app.screen is app.main


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


def test_help_lists_the_output_and_stacks_keys() -> None:
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(help_table(readonly=True))  # neither steers: both stay on under --readonly
    lines = [line.split() for line in console.export_text().splitlines()]
    assert ["f", "Output:", "follow", "a", "rank's", "log", "as", "it", "is", "written"] in lines
    assert ["s", "Stacks:", "the", "Python", "stacks", "of", "the", "node's", "ranks,", "taken", "live"] in lines


@pytest.mark.asyncio
async def test_the_output_view_follows_the_rank_into_the_next_round() -> None:
    async with fake_app().run_test(size=SIZE) as pilot:
        app = await follow_rank_1(pilot)
        first = output_lines(app)
        link = daemon(app)
        link.printed[1].append("[rank 1] step 250 loss 0.3500")  # its last line before the crash
        link.restart()
        link.printed[1] += ["[rank 1] resumed at step 201", "[rank 1] step 210 loss 0.4000"]
        await until(pilot, lambda: output_lines(app)[-1:] == ["[rank 1] step 210 loss 0.4000"], what="round 3")
        assert output_lines(app) == [*first, "[rank 1] step 250 loss 0.3500", "── round 3 ──",
                                     "[rank 1] resumed at step 201", "[rank 1] step 210 loss 0.4000"]
        assert "· round 3 ·" in shown(app, "#output-title")
        link.printed[1].append("[rank 1] step 220 loss 0.3900")  # and it goes on in the new round's log
        await until(pilot, lambda: output_lines(app)[-1:] == ["[rank 1] step 220 loss 0.3900"], what="new lines")
