"""Node detail: the node's workers, its root cause, its recent events and the last lines of each worker's log."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static

from elasticd.commands.event_text import describe
from elasticd.commands.render import GPU_COLUMNS, gpu_cells, has_gpu, short_path
from tui.actions import screen_bindings
from tui.diagnosis import tails_text, whole
from tui.feeds import IO_ERRORS, reason
from tui.liveness import format_age, format_bytes
from tui.rows import Row, name_width
from tui.session import JobSession
from tui.views.table import SyncedTable

WORKER_COLUMNS = ("rank", "local", "pid", "state", "exit", "cpu%", "rss", "uptime", "log")
GPU_TABLE_COLUMNS = ("rank", *GPU_COLUMNS)  # its own table, shown only when the node's daemon has NVML
TAIL_LINES = 8
TAILS_EVERY_S = 1.0
RECENT_EVENTS = 5


class NodeDetailScreen(Screen[None]):
    """Esc goes back; the tails refresh every second, read on the node through the daemon this console asks."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back", id="detail.back"), *screen_bindings("output", "stacks")]
    DEFAULT_CSS = """
    NodeDetailScreen #detail-title { padding: 0 1; text-style: bold; background: $primary-darken-2; }
    NodeDetailScreen #detail-cause { padding: 0 1; text-style: bold; color: $error; }
    NodeDetailScreen #workers, NodeDetailScreen #gpus { height: auto; max-height: 12; }
    NodeDetailScreen #node-events { height: auto; padding: 0 1; border-bottom: solid $primary-darken-2; }
    """

    @dataclass
    class TailsRead(Message):
        tails: Text

    def __init__(self, session: JobSession, node_id: str) -> None:
        super().__init__()
        self.session, self.model, self.node_id = session, session.model, node_id

    def compose(self) -> ComposeResult:
        yield Static(id="detail-title")
        yield Static(id="detail-cause")
        yield SyncedTable(WORKER_COLUMNS, id="workers")
        yield SyncedTable(GPU_TABLE_COLUMNS, id="gpus")
        yield Static(id="node-events")
        with VerticalScroll():
            yield Static(id="tails")
        yield Footer()

    def on_mount(self) -> None:
        self.redraw()

    def on_screen_resume(self) -> None:
        self.read_tails()

    def on_screen_suspend(self) -> None:
        self.workers.cancel_group(self, "tails")  # covered (a rank's output, stacks): nobody reads them

    def redraw(self) -> None:
        node = self.model.node(self.node_id)
        names = self.model.short_names(name_width(self.size.width or self.app.size.width) * 2)
        name = names.get(node.node_id, node.node_id)
        self.query_one("#detail-title", Static).update(
            f"node {name} · host {node.host or '?'} · {node.role}/{node.daemon_state or node.status} · "
            f"{self.model.node_liveness(node)} {format_age(self.model.heartbeat_age(node))}")
        cause = self.model.recent_cause(self.node_id)
        cause_line = self.query_one("#detail-cause", Static)
        cause_line.display = cause is not None
        cause_line.update(cause.summary if cause is not None else "")
        rows: list[Row] = [(str(w.get("pid")), [str(w.get("rank")), str(w.get("local_rank")), pid_cell(w, node.kept),
                 Text(str(w.get("state")), style="green" if w.get("state") == "running" else "red"),
                 "-" if w.get("exit_code") is None else str(w.get("exit_code")),
                 f"{float(w.get('cpu_percent') or 0):.0f}", format_bytes(w.get("rss")),
                 format_age(w.get("uptime_s")), short_path(str(w.get("log", "")))]) for w in node.workers]
        self.query_one("#workers", SyncedTable).sync(rows)
        gpus = self.query_one("#gpus", SyncedTable)
        gpus.display = has_gpu(node.workers)
        if gpus.display:
            gpus.sync([(str(w.get("pid")), [str(w.get("rank")), *gpu_cells(w.get("gpu"))]) for w in node.workers])
        self.query_one("#node-events", Static).update(self.recent_events(names))

    def recent_events(self, names: dict[str, str]) -> Text:
        """The node's last few events, newest first, each as a sentence."""
        found: list[dict[str, Any]] = []
        for event in reversed(self.model.events):
            if event.get("node") == self.node_id:
                found.append(event)
                if len(found) == RECENT_EVENTS:
                    break
        text = Text("recent events\n", style="bold")
        for event in found:
            stamp = time.strftime("%H:%M:%S", time.gmtime(float(event.get("ts", 0))))
            text.append(f"{stamp} ", style="dim").append(f"{event.get('kind')} ", style="cyan")
            text.append(describe(event, lambda node_id: names.get(node_id, node_id)) + "\n")
        text.rstrip()
        return text if found else text.append("none", style="dim")

    def cursor_rank(self) -> int | None:
        """The rank of the worker under the workers table's cursor."""
        pid = self.query_one("#workers", SyncedTable).cursor_key()
        for worker in self.model.node(self.node_id).workers:
            if str(worker.get("pid")) == pid:
                return whole(worker.get("rank"))
        return None

    @work(exclusive=True, group="tails", exit_on_error=False)
    async def read_tails(self) -> None:
        """Each rank's last lines as the node reads them, or why it cannot, every second the screen is shown."""
        while True:
            try:
                tails = tails_text(await self.session.ask_node("logs", node=self.node_id, tail=TAIL_LINES))
            except IO_ERRORS as err:
                tails = Text(f"(no output from node {self.node_id}: {reason(err)})", style="dim")
            self.post_message(self.TailsRead(tails))
            await asyncio.sleep(TAILS_EVERY_S)

    def on_node_detail_screen_tails_read(self, message: NodeDetailScreen.TailsRead) -> None:
        self.redraw()
        self.query_one("#tails", Static).update(message.tails)


def pid_cell(worker: dict[str, Any], kept: set[int]) -> Text:
    """A worker kept through an in-place resize shows it: same process, new rank."""
    pid = worker.get("pid")
    text = Text(str(pid))
    if pid in kept:
        text.append(" kept", style="bold cyan")
    return text
