"""elastic-tui on the fake job: real-cluster node ids, rates out of the round, readable events, loss plot, ckpt age."""

from __future__ import annotations

import pytest
from support.console import SIZE, daemon, fake_app, screen_text, settle, until
from support.fake import HOSTNAMES, NOW
from textual.pilot import Pilot

from elasticd.wire.telemetry import StepTelemetry
from tui.app import ElasticApp
from tui.rows import checkpoint_rows, event_rows
from tui.views.loss import LossView, round_marks
from tui.widgets.header import JobHeader

pytestmark = [pytest.mark.quick, pytest.mark.asyncio]


def row_text(app: ElasticApp, key: str) -> list[str]:
    cells = dict(app.nodes_table.shown)[key]
    return [str(cell) for cell in cells]


async def test_hostname_ids_are_told_apart_in_every_view() -> None:
    app = fake_app(hostnames=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        shown = {key: row_text(app, key)[1] for key in app.nodes_table.keys}
        assert shown == {HOSTNAMES[n]: f"gpu-node-{i}…" for n, i in (("a", "017"), ("b", "018"), ("c", "117"))}
        assert all(name in screen_text(app) for name in shown.values())
        assert "coordinator gpu-node-017…" in str(app.query_one(JobHeader).shown)
        names = app.model.short_names(20)
        assert {str(cells[2]) for _, cells in event_rows(app.model, names)} == set(shown.values())
        assert {str(cells[1]) for key, cells in checkpoint_rows(app.model, names) if key != "job"} == \
            {"gpu-node-017…", "gpu-node-018…"}


async def test_narrow_terminal_hides_optional_columns_before_cutting_names() -> None:
    app = fake_app(hostnames=True)
    async with app.run_test(size=(80, 30)) as pilot:
        await settle(pilot)
        header = app.nodes_table.render_line(0).text
        assert "host" not in header and "rss" not in header and "node" in header
        names = [app.nodes_table.render_line(1 + row).text.split()[0] for row in range(3)]
        assert len(set(names)) == 3 and all(name.endswith(("017…", "018…", "117…")) for name in names), names


async def test_a_node_out_of_the_round_shows_no_stale_rates() -> None:
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        step, loss, thr = (app.nodes_table.column_names.index(c) for c in ("step", "loss", "thr/s"))
        assert [row_text(app, "b")[i] for i in (step, thr)] == ["240", "256.0"]
        daemon(app).roles["b"] = "standby"  # drained: out of the rank map, while its ranks keep their last report
        await until(pilot, lambda: app.model.nodes["b"].role == "standby", what="b drained")
        app.redraw()
        await pilot.pause()
        assert [row_text(app, "b")[i] for i in (step, loss, thr)] == ["-", "-", "-"]
        assert row_text(app, "a")[step] == "240"
        daemon(app).roles["a"] = "draining"
        await until(pilot, lambda: app.model.nodes["a"].role == "draining", what="a draining")
        app.redraw()
        await pilot.pause()
        assert row_text(app, "a")[thr] == "-"


async def test_events_read_like_a_person_wrote_them() -> None:
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("colon", *"events", "enter")
        await pilot.pause()
        text = screen_text(app)
        assert "saved step 200: 45.8M in 0.8 s" in text and "started ranks 0-1 of world 4" in text
        assert "0.800000" not in text and "{" not in text


async def test_log_scale_toggles_and_rounds_are_marked_on_the_steps() -> None:
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("l")
        await pilot.pause()
        plot = app.query_one(LossView)
        assert app.view == "loss" and plot.log_scale
        assert "log scale" in screen_text(app) and "120 r2" in screen_text(app)
        await pilot.press("l")
        await pilot.pause()
        assert not plot.log_scale and "linear" in screen_text(app)
        model = app.model  # round 3 shrinks the world to 2 at step 250
        model.apply_event({"seq": 99, "ts": NOW, "kind": "round_started", "node": "a", "round": 3, "world_size": 2})
        model.apply_steps("a", StepTelemetry.decode({"round": 3, "ranks": [{"rank": 0, "step": 250, "loss": 0.5}]}))
        assert round_marks(model, 0, 300) == [(0, "0 r1", False), (120, "120 r2", False), (250, "250 r3 4→2", True)]


async def test_the_job_checkpoint_age_is_in_the_header_and_the_ckpt_view() -> None:
    app = fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert "ckpt 42s ago" in str(app.query_one(JobHeader).shown)  # newest over ranks; rank 3 is 15 min old
        await pilot.press("colon", *"ckpt", "enter")
        await pilot.pause()
        key, cells = app.query_one("#ckpt").shown[0]  # type: ignore[attr-defined]
        assert key == "job" and [str(c) for c in cells[2:4]] == ["200", "42s"]


async def _open_node(pilot: Pilot) -> None:
    await settle(pilot)
    await pilot.press("enter")
    await pilot.pause()


async def test_node_detail_names_the_node_shortly_and_formats_its_events() -> None:
    app = fake_app(hostnames=True)
    async with app.run_test(size=SIZE) as pilot:
        await _open_node(pilot)
        text = screen_text(app)
        assert "node gpu-node-017.example.internal · host" in text  # room enough: the whole id
        assert "45.8M in 0.8 s" in text and "…/logs/demo/" in text
