"""The help screen: every key and action from the registry; steering actions greyed under --readonly."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.actions import ACTIONS


def help_table(readonly: bool) -> Table:
    table = Table(title="elastic-tui keys" + (" — READ-ONLY: steering disabled" if readonly else ""),
                  expand=True, box=None)
    table.add_column("key", style="bold cyan", width=7)
    table.add_column("action")
    table.add_column("kind", width=12)
    for spec in ACTIONS:
        disabled = readonly and spec.steers
        kind = "destructive" if spec.destructive else ("steer" if spec.steers else "")
        style = "dim strike" if disabled else ("red" if spec.destructive else "")
        table.add_row(spec.key_display, spec.description + (" (read-only)" if disabled else ""),
                      kind, style=style)
    table.add_row("enter", "Open the node under the cursor (workers, logs)", "")
    table.add_row("ctrl+p", "Command palette: every action by name", "")
    return table


class HelpScreen(ModalScreen[None]):
    """Esc, q or ? closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90; height: 80%; border: thick $primary; background: $surface; }
    """
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close", id="help.close")]

    def __init__(self, readonly: bool) -> None:
        super().__init__()
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(help_table(self.readonly))
