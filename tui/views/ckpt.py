"""The checkpoints view: the job's newest checkpoint, then per rank the last saved step, its age, size, duration."""

from __future__ import annotations

from tui.model import JobModel
from tui.rows import CKPT_COLUMNS, checkpoint_rows, name_width
from tui.views.table import SyncedTable


class CheckpointsView(SyncedTable):
    """Ages turn red past ten minutes; the first line is the job's."""

    def __init__(self) -> None:
        super().__init__(CKPT_COLUMNS, id="ckpt")

    def show(self, model: JobModel, marks: set[str], pattern: str) -> None:
        names = model.short_names(name_width(self.size.width or self.app.size.width))
        self.sync(checkpoint_rows(model, names, pattern))
