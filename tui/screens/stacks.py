"""A node's ranks' Python stacks (or one rank's), taken live by its daemon (`stacks`)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static

from tui.diagnosis import stacks_text
from tui.feeds import IO_ERRORS, reason
from tui.session import JobSession


class StacksScreen(Screen[None]):
    """Esc goes back."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back", id="stacks.back")]
    DEFAULT_CSS = """
    StacksScreen #stacks-title { padding: 0 1; text-style: bold; background: $primary-darken-2; }
    StacksScreen #stacks { padding: 0 1; }
    """

    @dataclass
    class Taken(Message):
        dumps: Text

    def __init__(self, session: JobSession, node_id: str, rank: int | None = None) -> None:
        super().__init__()
        self.session, self.node_id, self.rank = session, node_id, rank

    def compose(self) -> ComposeResult:
        whose = f"rank {self.rank} on node {self.node_id}" if self.rank is not None else f"node {self.node_id}"
        yield Static(f"Python stacks of {whose}, taken live", id="stacks-title")
        with VerticalScroll():
            yield Static(Text("taking the stacks…", style="dim"), id="stacks")
        yield Footer()

    def on_mount(self) -> None:
        self.take()

    @work(exclusive=True, group="stacks", exit_on_error=False)
    async def take(self) -> None:
        args = {"node": self.node_id, **({"rank": self.rank} if self.rank is not None else {})}
        try:
            dumps = stacks_text(await self.session.ask_node("stacks", **args))
        except IO_ERRORS as err:
            dumps = Text(f"(no stacks from node {self.node_id}: {reason(err)})", style="dim")
        self.post_message(self.Taken(dumps))

    def on_stacks_screen_taken(self, message: StacksScreen.Taken) -> None:
        self.query_one("#stacks", Static).update(message.dumps)
