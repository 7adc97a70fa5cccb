"""Helpers for the console's tests: a deterministic app on the fake job (support/fake.py), condition waits."""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable

from textual.pilot import Pilot

from support.fake import HOSTNAMES, NOW, FakeLink, fixed_clock, hostname_link
from tui.app import ElasticApp
from tui.screens.confirm import ConfirmScreen

SIZE = (120, 36)
SVG_CELL = 12.2  # pixels per cell in rich's SVG export (0.61 of its 20 px font)
SVG_TEXT = re.compile(r'<text class="[^"]*" x="([\d.]+)" y="[\d.]+" textLength="[\d.]+" '
                      r'clip-path="url\(#[^)]*-line-(\d+)\)">([^<]*)</text>')


def fake_app(readonly: bool = False, gpu: bool = False, hostnames: bool = False) -> ElasticApp:
    """The fake job. `gpu`: its daemons have NVML, so worker records carry GPU fields; `hostnames`: its nodes
    are gpu-node-017.example.internal … instead of a, b, c."""
    link = hostname_link() if hostnames else (lambda control: FakeLink(control, gpu))
    return ElasticApp({"demo": ["fake://a"]}, readonly=readonly, connect=link,
                      clock=fixed_clock, seed_pubs={"fake://a": "fake-pub://a"})


def daemon(app: ElasticApp) -> FakeLink:
    """The fake daemon the console asks through: tests change the job there, and the console's feed shows it."""
    link = app.session.link(app.session.active)
    assert isinstance(link, FakeLink)
    return link


def node_id(app: ElasticApp, short: str) -> str:
    """The fake's node `a`, `b` or `c` under the ids this app's fake gives it."""
    return short if short in app.model.nodes else HOSTNAMES[short]


async def until(pilot: Pilot, condition: Callable[[], bool], timeout: float = 20.0, what: str = "",
                seen: Callable[[], object] | None = None) -> None:
    """Poll until `condition`; a timeout says what was awaited and, with `seen`, what the screen showed instead."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            shown = f"; instead: {seen()!r}" if seen is not None else ""
            raise AssertionError(f"timed out waiting for {what or condition}{shown}")
        await pilot.pause(0.05)


async def confirm_dialog(pilot: Pilot, what: str = "the confirmation") -> ConfirmScreen:
    """The confirmation dialog once it shows its buttons: a pushed screen is current before it has composed."""
    await until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen) and bool(pilot.app.screen.query("#cancel")),
                what=what)
    assert isinstance(pilot.app.screen, ConfirmScreen)
    return pilot.app.screen


def fake_settled(app: ElasticApp) -> bool:
    model = app.model
    nodes = model.nodes
    a, b = node_id(app, "a"), node_id(app, "b")
    return (len(nodes) == 3 and all(n in nodes and nodes[n].last_seen == NOW for n in (a, b))
            and all(m.step == 240 for m in model.rank_metrics.values()) and len(model.rank_metrics) == 4
            and bool(nodes[a].workers) and bool(model.round_history))


async def settle(pilot: Pilot) -> None:
    await until(pilot, lambda: fake_settled(pilot.app), what="the fake job to load")  # type: ignore[arg-type]
    pilot.app.redraw()  # type: ignore[attr-defined]
    await pilot.pause()


def screen_text(app: ElasticApp) -> str:
    """What the terminal shows, as lines of text: the screenshot's text runs put back in their columns."""
    lines: dict[int, str] = {}
    for x, line, run in SVG_TEXT.findall(app.export_screenshot()):
        text = html.unescape(run).replace("\xa0", " ")
        column = round(float(x) / SVG_CELL)
        lines[int(line)] = lines.get(int(line), "").ljust(column) + text
    return "\n".join(lines[n] for n in sorted(lines))


async def cursor_to(pilot, app: ElasticApp, node: str) -> None:  # type: ignore[no-untyped-def]
    table = app.nodes_table
    await until(pilot, lambda: table.cursor_key() is not None and node in {k for k, _ in table.shown})
    table.move_cursor(row=[k for k, _ in table.shown].index(node))
    await until(pilot, lambda: table.cursor_key() == node, what=f"cursor on {node}")


def steering_answered(app: ElasticApp) -> bool:
    """No steering request of the app is in flight: whatever it sent, the daemon has answered."""
    return all(worker.is_finished for worker in app.workers if worker.group == "steer")
