"""One rank's output as it is written: its last lines, then what follows them (`logs` with `since`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, RichLog, Static

from tui.actions import screen_bindings
from tui.diagnosis import RankOutput, rank_outputs, whole
from tui.feeds import IO_ERRORS, reason
from tui.session import JobSession

FIRST_LINES = 200
FOLLOW_EVERY_S = 0.25  # the node reads at most 64 KB a call: 256 KB/s, more than a console can show
KEPT_LINES = 5000  # older lines scroll away


class RankOutputScreen(Screen[None]):
    """Esc goes back; the rank's round is followed until the node stops answering."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back", id="output.back"), *screen_bindings("stacks")]
    DEFAULT_CSS = """
    RankOutputScreen #output-title { padding: 0 1; text-style: bold; background: $primary-darken-2; }
    """

    @dataclass
    class Read(Message):
        """The lines written since the last read, and the rank's process as its node sees it now."""

        output: RankOutput
        round: int | None

    @dataclass
    class Stopped(Message):
        reason: str

    def __init__(self, session: JobSession, node_id: str, rank: int) -> None:
        super().__init__()
        self.session, self.node_id, self.rank = session, node_id, rank
        self.said = ""  # the last note shown: a deleted log's note is said once, not at every read

    def compose(self) -> ComposeResult:
        yield Static(f"rank {self.rank} on node {self.node_id}", id="output-title")
        yield RichLog(max_lines=KEPT_LINES, id="output")
        yield Footer()

    def on_mount(self) -> None:
        self.follow()

    @work(exclusive=True, group="output", exit_on_error=False)
    async def follow(self) -> None:
        """The last lines, then every quarter second those past the offset read, in the round first shown."""
        ask: dict[str, Any] = {"node": self.node_id, "rank": self.rank}
        try:
            reply = await self.session.ask_node("logs", tail=FIRST_LINES, **ask)
            round_id = whole(reply.get("round"))
            if round_id is not None:  # a new round writes another file: the offsets are this one's
                ask["round"] = round_id
            while True:
                for output in rank_outputs(reply)[:1]:
                    self.post_message(self.Read(output, round_id))
                    ask["since"] = output.offset
                await asyncio.sleep(FOLLOW_EVERY_S)
                reply = await self.session.ask_node("logs", **ask)
        except IO_ERRORS as err:
            self.post_message(self.Stopped(reason(err)))

    def on_rank_output_screen_read(self, message: RankOutputScreen.Read) -> None:
        output = message.output
        self.query_one("#output-title", Static).update(
            f"{output.title} on node {self.node_id} · round {message.round} · {output.path}")
        log = self.query_one(RichLog)
        for line in output.text_lines(self.said):
            log.write(line)
        self.said = output.note

    def on_rank_output_screen_stopped(self, message: RankOutputScreen.Stopped) -> None:
        self.query_one(RichLog).write(Text(f"(no longer following: {message.reason})", style="bold yellow"))
