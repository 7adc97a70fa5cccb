"""Snapshot tests of every elastic-tui view at 120x36, fed by the deterministic fake job."""

from __future__ import annotations

import pytest
from support.console import SIZE, confirm_dialog, fake_app, settle, until
from textual.pilot import Pilot

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`


def go(view: str):  # type: ignore[no-untyped-def]
    async def run_before(pilot: Pilot) -> None:
        await settle(pilot)
        await pilot.press("colon", *view, "enter")
        await pilot.pause()
        pilot.app.redraw()  # type: ignore[attr-defined]
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("view", ["nodes", "ranks", "events", "ckpt", "loss", "goodput"])
def test_view(snap_compare, view: str) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(fake_app(), terminal_size=SIZE, run_before=go(view))


async def open_node_detail(pilot: Pilot) -> None:
    await settle(pilot)
    await pilot.press("enter")
    await until(pilot, lambda: "rank 1" in str(pilot.app.screen.query_one("#tails").render()))


def test_node_detail(snap_compare) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(fake_app(), terminal_size=SIZE, run_before=open_node_detail)


def test_node_detail_with_gpus(snap_compare) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(fake_app(gpu=True), terminal_size=SIZE, run_before=open_node_detail)


def test_drain_confirmation_states_the_plan(snap_compare) -> None:  # type: ignore[no-untyped-def]
    async def run_before(pilot: Pilot) -> None:
        await settle(pilot)
        await pilot.press("down", "D")
        await confirm_dialog(pilot)
        await pilot.pause()

    assert snap_compare(fake_app(), terminal_size=SIZE, run_before=run_before)


def test_refused_drain_offers_force(snap_compare) -> None:  # type: ignore[no-untyped-def]
    async def run_before(pilot: Pilot) -> None:
        await settle(pilot)
        await pilot.press("D")
        await confirm_dialog(pilot)
        await pilot.pause()

    assert snap_compare(fake_app(), terminal_size=SIZE, run_before=run_before)


def test_readonly_help(snap_compare) -> None:  # type: ignore[no-untyped-def]
    async def run_before(pilot: Pilot) -> None:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(fake_app(readonly=True), terminal_size=SIZE, run_before=run_before)


@pytest.mark.parametrize("view", ["nodes", "events"])
def test_hostname_node_ids(snap_compare, view: str) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(fake_app(hostnames=True), terminal_size=SIZE, run_before=go(view))
