"""The checkpoints view: per rank, the last saved step, its age, size and duration."""

from __future__ import annotations

from tui.model import JobModel
from tui.rows import CKPT_COLUMNS, checkpoint_rows
from tui.views.table import SyncedTable


class CheckpointsView(SyncedTable):
    """Ages turn red past ten minutes."""

    def __init__(self) -> None:
        super().__init__(CKPT_COLUMNS, id="ckpt")

    def show(self, model: JobModel, marks: set[str], pattern: str) -> None:
        self.sync(checkpoint_rows(model, pattern))
