"""The console's views: nodes, ranks, events, checkpoints, loss and goodput; each redraws from the job model."""

from __future__ import annotations

from tui.views.ckpt import CheckpointsView
from tui.views.events import EventsView
from tui.views.goodput import GoodputView
from tui.views.loss import LossView
from tui.views.nodes import NodesView
from tui.views.ranks import RanksView

VIEW_NAMES = {"nodes": "nodes", "n": "nodes", "no": "nodes", "ranks": "ranks", "r": "ranks", "rank": "ranks",
              "events": "events", "ev": "events", "e": "events", "ckpt": "ckpt", "checkpoints": "ckpt",
              "c": "ckpt", "loss": "loss", "l": "loss", "plot": "loss", "goodput": "goodput", "g": "goodput",
              "gp": "goodput"}
__all__ = ["VIEW_NAMES", "CheckpointsView", "EventsView", "GoodputView", "LossView", "NodesView", "RanksView"]
