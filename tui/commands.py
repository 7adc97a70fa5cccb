"""The command palette provider: every registry action by name; read-only steering shows as disabled."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from tui.actions import ACTIONS, ActionSpec


class ActionsProvider(Provider):
    """Runs the same action a key would, through ElasticApp.action_run."""

    def label(self, spec: ActionSpec) -> str:
        readonly = bool(getattr(self.app, "readonly", False))  # ElasticApp's flag; the palette needs nothing else
        off = " (disabled: read-only)" if readonly and spec.steers else ""
        return f"{spec.description} [{spec.key_display}]{off}"

    async def discover(self) -> Hits:
        for spec in ACTIONS:
            yield DiscoveryHit(self.label(spec), partial(self.app.run_action, f"run('{spec.id}')"),
                               help=spec.id)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for spec in ACTIONS:
            label = self.label(spec)
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), partial(self.app.run_action, f"run('{spec.id}')"),
                          help=spec.id)
