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

from elasticd.client import ClientError
from tui.actions import screen_bindings
from tui.diagnosis import RankOutput, rank_outputs, whole
from tui.feeds import IO_ERRORS, reason
from tui.session import JobSession

FIRST_LINES = 200
FOLLOW_EVERY_S = 0.25  # the node reads at most 64 KB a call: 256 KB/s, more than a console can show
KEPT_LINES = 5000  # older lines scroll away
SILENCES = 3  # unanswered reads in a row that end the follow: one slow answer from a loaded node does not


class RankOutputScreen(Screen[None]):
    """Esc goes back; the rank is followed from round to round until its node stops answering."""

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

    @dataclass
    class Silent(Message):
        """A read the node did not answer in time; the follow goes on."""

        reason: str

    def __init__(self, session: JobSession, node_id: str, rank: int) -> None:
        super().__init__()
        self.session, self.node_id, self.rank = session, node_id, rank
        self.said = ""  # the last note shown: a deleted log's note is said once, not at every read
        self.round_shown: int | None = None
        self.silences = 0  # reads in a row the node did not answer

    def compose(self) -> ComposeResult:
        yield Static(f"rank {self.rank} on node {self.node_id}", id="output-title")
        yield RichLog(max_lines=KEPT_LINES, id="output")
        yield Footer()

    def on_mount(self) -> None:
        self.follow()

    @work(exclusive=True, group="output", exit_on_error=False)
    async def follow(self) -> None:
        """The last lines, then every quarter second those past the offset read. Once the job is in a newer round,
        the rest of this round's log, then the rank's log in the node's newest round (a restart writes a new one)."""
        rank = {"node": self.node_id, "rank": self.rank}
        try:
            while True:
                while (reply := await self.read(tail=FIRST_LINES, **rank)) is None:
                    await asyncio.sleep(FOLLOW_EVERY_S)
                round_id = whole(reply.get("round"))
                ask: dict[str, Any] = {**rank, "round": round_id} if round_id is not None else dict(rank)
                self.show(reply, round_id, ask)
                newer = False
                while not newer:
                    await asyncio.sleep(FOLLOW_EVERY_S)
                    newer = await self.newer_round(round_id)
                    self.show(await self.read(**ask), round_id, ask)  # when newer: its last
        except IO_ERRORS as err:
            self.post_message(self.Stopped(reason(err)))

    async def read(self, **args: Any) -> dict[str, Any] | None:
        """One `logs` read; None where the node did not answer in time, fewer than SILENCES times in a row (the
        follow goes on and says so); past that, or on any other error, the error."""
        try:
            reply = await self.session.ask_node("logs", **args)
        except ClientError as err:
            self.silences += 1
            if err.code != "timeout" or self.silences >= SILENCES:
                raise
            self.post_message(self.Silent(reason(err)))
            return None
        self.silences = 0
        return reply

    def show(self, reply: dict[str, Any] | None, round_id: int | None, ask: dict[str, Any]) -> None:
        """The reply's lines to the screen; the next read goes on from where they end."""
        for output in rank_outputs(reply)[:1] if reply is not None else []:
            self.post_message(self.Read(output, round_id))
            ask["since"] = output.offset

    async def newer_round(self, round_id: int | None) -> bool:
        """Whether the node has started this rank's log of a round after `round_id`: asked only once the console
        sees the job in a newer round (a restart or a new world), not at every poll."""
        if round_id is None or self.session.model.job.round <= round_id:
            return False
        reply = await self.read(tail=0, node=self.node_id, rank=self.rank)
        newest = whole(reply.get("round")) if reply is not None else None
        return newest is not None and newest > round_id

    def on_rank_output_screen_read(self, message: RankOutputScreen.Read) -> None:
        output = message.output
        self.query_one("#output-title", Static).update(
            f"{output.title} on node {self.node_id} · round {message.round} · {output.path}")
        log = self.query_one(RichLog)
        if self.round_shown is not None and message.round != self.round_shown:
            log.write(Text(f"── round {message.round} ──", style="bold cyan"))
        self.round_shown = message.round
        for line in output.text_lines(self.said):
            log.write(line)
        self.said = output.note

    def on_rank_output_screen_stopped(self, message: RankOutputScreen.Stopped) -> None:
        self.query_one(RichLog).write(Text(f"(no longer following: {message.reason})", style="bold yellow"))

    def on_rank_output_screen_silent(self, message: RankOutputScreen.Silent) -> None:
        self.query_one(RichLog).write(Text(f"({message.reason}; still following)", style="dim yellow"))
