"""elastic-tui against real daemons (2 nodes, ticker worker): views, a remote rank's output and stacks, drain with
confirm, cancel, read-only.

A test that asserts something did not happen first waits for a sign that it could have: every key answered
with its notice, and every steering request the app started answered by the daemon.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from support.console import SIZE, confirm_dialog, cursor_to, steering_answered, until
from support.harness import TICKER, Job
from textual.message import Message
from textual.notifications import Notify
from textual.pilot import Pilot
from textual.widgets import Button, RichLog, Static

from tui.app import ElasticApp
from tui.screens.confirm import ConfirmScreen
from tui.screens.node_detail import NodeDetailScreen
from tui.screens.rank_output import RankOutputScreen
from tui.screens.stacks import StacksScreen

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    job = Job(Path(tmp_path_factory.mktemp("tui")), nnodes="1:2", nproc=1)
    job.start("a", TICKER)
    job.start("b", TICKER)
    started = job.wait_event("round_started", lambda e: e["world_size"] == 2)
    for node in "ab":  # each node's worker of that round is up: a rank's output screen follows the round it first
        # reads, and one opened before a's new worker started followed its last round's file, which never grew
        job.wait_event("workers_started", lambda e, n=node: e["node"] == n and e["round"] == started["round"],
                       since=started["seq"])
    yield job
    job.close()


def connected(app: ElasticApp, world: int = 2) -> bool:
    model = app.model
    return (model.job.world_size == world and set(model.nodes) >= {"a", "b"}
            and all(model.node_liveness(n) == "live" for n in model.nodes.values()))


@asynccontextmanager
async def console_on_b(job: Job, readonly: bool = False) -> AsyncIterator[tuple[ElasticApp, Pilot, list[str]]]:
    """The console on daemon a, both nodes live, the cursor on node b; and the text of every notice it raises."""
    app = ElasticApp({job.job_id: [job.daemons["a"].control]}, readonly=readonly)
    notices: list[str] = []

    def record(message: Message) -> None:  # toasts expire; this record does not
        if isinstance(message, Notify):
            notices.append(message.notification.message)

    async with app.run_test(size=SIZE, message_hook=record) as pilot:
        await until(pilot, lambda: connected(app))
        await cursor_to(pilot, app, "b")
        yield app, pilot, notices


def goodput_text(app: ElasticApp) -> str:
    return str(app.query_one("#goodput-table", Static).render())


def stacks_text(app: ElasticApp) -> str:
    return str(app.screen.query_one("#stacks", Static).render())


async def test_one_member_address_shows_the_whole_job_and_every_view(job: Job) -> None:
    app = ElasticApp({job.job_id: [job.daemons["b"].control]})
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: connected(app), what="both daemons live")
        assert app.model.job.job_id == job.job_id and app.model.job.coordinator == "a"
        for view in ("ranks", "events", "ckpt", "loss", "goodput", "nodes"):
            await pilot.press("colon", *view, "enter")
            await until(pilot, lambda v=view: app.view == v, what=f"view {view}")
            if view == "goodput":  # the coordinator's own accounting, polled every 5 s
                await until(pilot, lambda: "of rank time trained" in goodput_text(app), what="goodput's table")
        await until(pilot, lambda: any(e.get("kind") == "round_started" for e in app.model.events))
        await until(pilot, lambda: bool(app.model.nodes["a"].workers))
        await cursor_to(pilot, app, "a")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, NodeDetailScreen))
        await until(pilot, lambda: "tick=" in str(app.screen.query_one("#tails").render()), what="log tail")
        await pilot.press("escape")
        await pilot.press("slash", "b")
        await until(pilot, lambda: [k for k, _ in app.nodes_table.shown] == ["b"], what="filter to b")


async def test_a_remote_ranks_output_and_stacks_come_through_another_daemon(job: Job) -> None:
    app = ElasticApp({job.job_id: [job.daemons["b"].control]})
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: connected(app) and bool(app.model.nodes["a"].workers), what="both daemons live")
        await cursor_to(pilot, app, "a")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, NodeDetailScreen))
        await pilot.press("f")
        await until(pilot, lambda: isinstance(app.screen, RankOutputScreen))

        def lines() -> list[str]:
            return [s.text for s in app.screen.query_one(RichLog).lines]

        def ticks() -> list[str]:
            return [line for line in lines() if line.startswith("tick=")]

        await until(pilot, lambda: bool(ticks()), what="the first lines")
        first = ticks()[-1]
        await until(pilot, lambda: ticks()[-1] != first, what="lines written after the first read",
                    seen=lambda: (lines()[-3:], app.screen.query_one("#output-title", Static).render()))
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, StacksScreen) and "taking" not in stacks_text(app))
        assert "── rank 0 (pid" in stacks_text(app) and "ticker.py" in stacks_text(app), stacks_text(app)


async def test_cancel_changes_nothing(job: Job) -> None:
    mark = job.seq()
    async with console_on_b(job) as (app, pilot, notices):
        await pilot.press("D")
        dialog = await confirm_dialog(pilot)
        assert "world 2 → 1; ranks 1 leave" in str(dialog.query_one("#effect").render())
        await until(pilot, lambda: isinstance(app.focused, Button), what="a focused button")
        assert isinstance(app.focused, Button) and app.focused.id == "cancel"
        await pilot.press("escape")
        await until(pilot, lambda: any(n.endswith(": cancelled") for n in notices), what="the cancel notice")
        await until(pilot, lambda: steering_answered(app), what="the dry run answered")
        assert not isinstance(app.screen, ConfirmScreen)
    with job.client() as client:
        kinds = {e["kind"] for e in client.call("events", since_seq=mark, limit=0)["events"]}
    assert "drain_started" not in kinds and job.status()["world_size"] == 2


async def test_readonly_disables_every_action(job: Job) -> None:
    mark = job.seq()
    keys = ("D", "K", "R", "S", "c", "o", "u", "plus", "minus")
    async with console_on_b(job, readonly=True) as (app, pilot, notices):
        assert app.check_action("run", ("drain",)) is None and app.check_action("run", ("help",))
        await pilot.press(*keys)
        # every key handled: each steering action named in a read-only notice of its own
        await until(pilot, lambda: len({n for n in notices if n.startswith("read-only: ")}) == len(keys),
                    what="a read-only notice per key")
        await until(pilot, lambda: steering_answered(app), what="no steering request in flight")
        await pilot.pause()  # a plan that came back would be on screen now
        assert not isinstance(app.screen, ConfirmScreen)
    with job.client() as client:
        kinds = {e["kind"] for e in client.call("events", since_seq=mark, limit=0)["events"]}
    assert "command_received" not in kinds and job.status()["world_size"] == 2


async def test_drain_with_confirm_shrinks_the_world(job: Job) -> None:
    async with console_on_b(job) as (app, pilot, notices):
        await pilot.press("D")
        await confirm_dialog(pilot)
        await pilot.click("#confirm")
        await until(pilot, lambda: app.model.job.world_size == 1 and app.model.nodes["b"].role == "standby",
                    timeout=40, what="world 1 after drain")
        await until(pilot, lambda: any("accepted" in n for n in notices))
        # The status poll may show world 1 before the event stream brings the drain's end (two channels; it lagged
        # under a loaded suite): the console shows it once it arrives.
        await until(pilot, lambda: any(e.get("kind") == "drain_complete" for e in app.model.events),
                    what="drain_complete among the console's events")
    assert job.status()["world_size"] == 1


async def test_a_sigkilled_daemon_shows_missing_and_the_screen_keeps_responding(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1:2", nproc=1) as doomed:
        doomed.start("a", TICKER)
        b = doomed.start("b", TICKER)
        doomed.wait_event("round_started", lambda e: e["world_size"] == 2)
        app = ElasticApp({doomed.job_id: [doomed.daemons["a"].control]})
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: connected(app))
            b.kill_with_workers()
            await until(pilot, lambda: app.model.node_liveness(app.model.nodes["b"]) in ("missing", "lost"),
                        what="b missing")
            await pilot.press("colon", *"events", "enter")  # the screen still answers keys
            await until(pilot, lambda: app.view == "events")
            # a's beats go on (under a loaded machine one may come late: a moment's `stale`, not b's fate)
            await until(pilot, lambda: app.model.node_liveness(app.model.nodes["a"]) == "live", what="a live")
            assert app.model.node_liveness(app.model.nodes["b"]) != "live"
