"""Alarms: a `goodput_low` event when the job's goodput over its window falls under the operator's floor, and a
`checkpoint_stale` event when its newest checkpoint is older than the operator allows (`--alert-*` flags).

Each fires once, and is armed again when the figure is back: goodput above the floor, a new checkpoint. They are
job events like any other, so `--on-event goodput_low:...` pages on them, and the console and `events` show them.
"""

from __future__ import annotations

from elasticd.coordinator.core import CoordinatorCore
from elasticd.coordinator.goodput import GoodputLedger
from elasticd.wire.names import EventKind, JobState

CHECK_EVERY_S = 5.0


class Alarms:
    """The two thresholds of `JobConfig` (`alert_goodput_below`, `alert_checkpoint_age_s`), looked at every 5 s."""

    def __init__(self, core: CoordinatorCore, ledger: GoodputLedger) -> None:
        self.core, self.ledger = core, ledger
        self.due = 0.0
        self.goodput_low = False  # said, and not yet back above the floor
        self.stale_since: float | None = None  # the checkpoint time `checkpoint_stale` was said for

    def check(self, now: float) -> None:
        cfg = self.core.cfg
        if now < self.due or self.core.state != JobState.running:
            return
        self.due = now + CHECK_EVERY_S
        if cfg.alert_goodput_below and now - self.ledger.started >= cfg.alert_goodput_window_s:
            self.check_goodput(now, cfg.alert_goodput_below, cfg.alert_goodput_window_s)
        saved = self.ledger.last_save
        if cfg.alert_checkpoint_age_s and saved is not None and saved != self.stale_since \
                and now - saved > cfg.alert_checkpoint_age_s:
            self.stale_since = saved
            self.core.emit(EventKind.checkpoint_stale, age_s=round(now - saved, 1),
                           max_age_s=cfg.alert_checkpoint_age_s, saved_at=saved)

    def check_goodput(self, now: float, floor: float, window_s: float) -> None:
        share = self.ledger.window_share(now, window_s)
        if share is None:
            return
        if share < floor and not self.goodput_low:
            self.core.emit(EventKind.goodput_low, goodput=share, floor=floor, window_s=window_s)
        self.goodput_low = share < floor
