"""The console's actions: local ones here, steering ones from the verbs' console bindings; keys, help, palette."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from textual.binding import Binding, BindingType

from elasticd.commands.registry import REGISTRY
from elasticd.commands.verb import Command


@dataclass(frozen=True)
class ActionSpec:
    """One thing the operator can do; `verb` is set for steering actions (sent to the daemon)."""

    id: str
    key: str
    description: str
    verb: str = ""
    destructive: bool = False
    targets: str = ""  # "nodes" (marked or cursor), "rank", "job", or "" for local actions
    show: bool = True

    @property
    def steers(self) -> bool:
        return bool(self.verb)

    @property
    def key_display(self) -> str:
        return {"question_mark": "?", "colon": ":", "slash": "/", "plus": "+", "minus": "-",
                "escape": "esc", "space": "space", "full_stop": "."}.get(self.key, self.key)


LOCAL: tuple[ActionSpec, ...] = (
    ActionSpec("command_bar", "colon", "Command bar (:nodes :ranks :events :ckpt :loss :goodput :job ID)"),
    ActionSpec("filter", "slash", "Filter the current view"),
    ActionSpec("help", "question_mark", "Help: every key and action"),
    ActionSpec("mark", "space", "Mark or unmark the node (targets of drain/cordon)", show=False),
    ActionSpec("back", "escape", "Back / clear filter and marks", show=False),
    ActionSpec("quit", "q", "Quit"),
    ActionSpec("view_nodes", "1", "View: nodes", show=False),
    ActionSpec("view_ranks", "2", "View: rank map and round history", show=False),
    ActionSpec("view_events", "3", "View: events and recovery timelines", show=False),
    ActionSpec("view_ckpt", "4", "View: checkpoints", show=False),
    ActionSpec("view_loss", "5", "View: loss plot", show=False),
    ActionSpec("view_goodput", "6", "View: goodput, lost time by cause over time", show=False),
    ActionSpec("next_job", "right_square_bracket", "Next job", show=False),
    ActionSpec("log_scale", "l", "Loss plot: log scale on or off", show=False),
    ActionSpec("output", "f", "Output: follow a rank's log as it is written", show=False),
    ActionSpec("stacks", "s", "Stacks: the Python stacks of the node's ranks, taken live", show=False),
)


def steering(commands: Iterable[Command]) -> tuple[ActionSpec, ...]:
    """Every console binding of the verbs: the safe ones first, then the destructive ones, each by key."""
    specs = [ActionSpec(b.id, b.key, b.description, verb=cmd.name, destructive=b.destructive, targets=b.targets)
             for cmd in commands for b in cmd.console]
    return tuple(sorted(specs, key=lambda spec: (spec.destructive, spec.key_display)))


ACTIONS: tuple[ActionSpec, ...] = LOCAL + steering(REGISTRY.values())
ACTIONS_BY_ID: dict[str, ActionSpec] = {spec.id: spec for spec in ACTIONS}
STEERING_KEYS: dict[str, ActionSpec] = {spec.key: spec for spec in ACTIONS if spec.steers}


def binding(spec: ActionSpec, action: str, show: bool) -> Binding:
    """A key for an action, with the action's id so a keymap can remap it."""
    return Binding(spec.key, action, spec.description.split(":")[0].split(" (")[0], show=show,
                   key_display=spec.key_display, id=spec.id, tooltip=spec.description)


def bindings() -> list[BindingType]:
    """The app's keys: every action of the registry."""
    return [binding(spec, f"run('{spec.id}')", spec.show) for spec in ACTIONS]


def screen_bindings(*action_ids: str) -> list[BindingType]:
    """A screen's footer shows these actions (the main one hides them); the app runs them as it does its own."""
    return [binding(ACTIONS_BY_ID[action_id], f"app.run('{action_id}')", True) for action_id in action_ids]
