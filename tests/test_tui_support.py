"""Shared helpers for the elastic-tui tests (no tests here): a deterministic app and condition waits."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.pilot import Pilot

from tui.app import ElasticApp
from tui.fake import NOW, FakeLink, fixed_clock

SIZE = (120, 36)


def fake_app(readonly: bool = False, gpu: bool = False) -> ElasticApp:
    """`gpu`: the fake daemons have NVML, so worker records carry GPU fields."""
    return ElasticApp({"demo": ["fake://a"]}, readonly=readonly, connect=lambda control: FakeLink(control, gpu),
                      clock=fixed_clock, seed_pubs={"fake://a": "fake-pub://a"})


async def until(pilot: Pilot, condition: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await pilot.pause(0.05)


def fake_settled(app: ElasticApp) -> bool:
    model = app.model
    nodes = model.nodes
    return (len(nodes) == 3 and all(nodes[n].last_seen == NOW for n in ("a", "b"))
            and all(m.step == 240 for m in model.rank_metrics.values()) and len(model.rank_metrics) == 4
            and bool(nodes["a"].workers) and bool(model.round_history))


async def settle(pilot: Pilot) -> None:
    await until(pilot, lambda: fake_settled(pilot.app), what="the fake job to load")  # type: ignore[arg-type]
    pilot.app.redraw()  # type: ignore[attr-defined]
    await pilot.pause()
