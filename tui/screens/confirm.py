"""The steering confirmation dialog: states the planned effect; Cancel is focused; refusals offer Force."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static


class ConfirmScreen(ModalScreen[str]):
    """Dismisses with "confirm", "force" or "cancel"."""

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 72; height: auto; border: thick $warning; background: $surface; padding: 1 2; }
    ConfirmScreen #title { text-style: bold; }
    ConfirmScreen #effect { margin: 1 0; }
    ConfirmScreen Horizontal { height: auto; align: right middle; }
    ConfirmScreen Button { margin-left: 2; }
    """
    BINDINGS = [Binding("escape", "dismiss('cancel')", "Cancel", id="confirm.cancel")]
    AUTO_FOCUS = "#cancel"  # Textual focuses it once composed (a query in on_mount fails on a screen closing early)

    def __init__(self, title: str, effect: str, refused: str = "", destructive: bool = False) -> None:
        super().__init__()
        self.title_text, self.effect, self.refused, self.destructive = title, effect, refused, destructive

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, id="title")
            if self.refused:
                yield Static(f"[b red]Refused:[/] {self.refused}", id="effect")
                yield Static("Force overrides the interlock (you confirm once more).", classes="hint")
            else:
                yield Static(f"Effect: {self.effect}", id="effect")
            with Horizontal():
                yield Button("Cancel", id="cancel", variant="primary")
                if self.refused:
                    yield Button("Force…", id="force", variant="error")
                else:
                    yield Button("Confirm", id="confirm", variant="error" if self.destructive else "warning")

    @on(Button.Pressed)
    def answer(self, event: Button.Pressed) -> None:
        self.dismiss(str(event.button.id))
