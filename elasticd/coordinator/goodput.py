"""Where the job's time went (goodput): training, recovery by reason, checkpoint stalls, redone work, waiting.

docs/architecture.md, "Goodput". Fed every event of the job log, in order; it accounts once per round (at its
first step) and never per step. Its totals go out in a `goodput` event at each round's first step, so a
coordinator that takes over resumes them from the log it adopts.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from elasticd.coordinator.goodput_nodes import IDLE, NodeTime, NodeTotals, seconds_of
from elasticd.job.events import ts_of
from elasticd.wire.names import Cause, EventKind
from elasticd.wire.protocol import Json, JsonObject
from elasticd.wire.read_replies import Buckets, GoodputReply, GoodputTimeline

TRAINING, CHECKPOINT, REDONE, WAITING = "training", "checkpoint", "redone", "waiting"
# Recovery, by what began it.
CRASH, HANG, NODE_LOSS, JOIN, LEAVE, SCALE, OPERATOR, TAKEOVER, START = (
    "crash", "hang", "node_loss", "join", "leave", "scale", "operator", "takeover", "start")
WINDOW_S = 3600.0  # the sliding window `goodput` reports beside the job's life
TIMELINE_BINS = 30  # slices of the window (or of the job's life, if shorter) in the report's timeline
FAILURES = (Cause.failure, Cause.hang)
TRANSITION_REASONS = {"drain": LEAVE, "cordon": LEAVE, "stop": LEAVE, "scale": SCALE}
Event = Mapping[str, Json]  # one of the job log's (elasticd/job/events.py)


@dataclass
class Split:
    """Seconds of one stretch of time by bucket (`recovery.REASON` for recovery), and its ranks."""

    start: float
    end: float
    ranks: int
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, bucket: str, seconds: float) -> float:
        seconds = max(0.0, seconds)
        if seconds:
            self.seconds[bucket] = self.seconds.get(bucket, 0.0) + seconds
        return seconds


class LedgerState(NodeTotals):
    """What a `goodput` event carries: the closed totals a coordinator taking over resumes from."""

    totals: dict[str, float]
    rank_totals: dict[str, float]
    started: float
    redone_steps: int
    last_save: float | None


def overlap(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by the spans (which may overlap one another)."""
    covered, reach = 0.0, start
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered, reach = covered + b - a, b
    return covered


class GoodputLedger:
    """The job's time, stretch by stretch: each ends at a round's first step (or the job's end)."""

    def __init__(self, started: float) -> None:
        self.totals: dict[str, float] = {}  # seconds by bucket, closed stretches only
        self.rank_totals: dict[str, float] = {}  # rank-seconds by bucket
        self.recent: deque[Split] = deque()  # closed stretches of the last WINDOW_S
        self.started = self.mark = started  # the job's start; where the open stretch begins
        self.training = False  # the open stretch is training (the round took its first step)
        self.stop_at: float | None = None  # when training stopped, while the next round forms
        self.reason = START
        self.world = 0
        self.cause = ""  # the current round's
        self.saves: list[tuple[float, float]] = []  # checkpoint stalls in the open stretch
        self.waits: list[tuple[float, float]] = []  # below --nnodes min, in the open stretch
        self.waiting_since: float | None = None
        self.transition = ""  # the graceful change in flight: its op id
        self.transition_reason = ""
        self.high_step: int | None = None  # the highest step the stopped round reached (workers_stopped)
        self.first: tuple[float, int] | None = None  # the current round's first step: (time, step)
        self.step_time = 0.0
        self.redo_s = 0.0  # redone work still to be carved out of the next training
        self.redone_steps = 0
        self.ended = False
        self.last_save: float | None = None  # the newest checkpoint's time, or the job's first step before one
        self.nodes = NodeTime()
        self.handlers: dict[str, Callable[[Event, float], object]] = {
            EventKind.worker_exited: self.crashed, EventKind.worker_left: self.crashed,
            EventKind.node_joined: lambda e, ts: self.nodes.joined_at(str(e.get("node")), ts),
            EventKind.node_left: lambda e, ts: self.nodes.left_at(str(e.get("node")), ts),
            EventKind.node_lost: self.lost,
            EventKind.worker_hung: lambda _e, ts: self.disrupt(ts, HANG),
            EventKind.checkpoint_saved: self.saved, EventKind.workers_stopped: self.stopped,
            EventKind.waiting: self.waiting, EventKind.coordinator_elected: self.took_over,
            EventKind.round_started: self.round_started, EventKind.first_step: self.first_step,
            EventKind.job_end: self.job_end}

    # -- the events -----------------------------------------------------------------------------------
    def observe(self, event: Event, replay: bool = False) -> None:
        """One event of the job log; `replay`: a log adopted at a takeover, whose `goodput` events resume."""
        kind, ts = str(event.get("kind")), ts_of(event)
        if self.ended or not ts:
            return
        if kind == EventKind.goodput:
            if replay and event.get("totals"):
                self.resume(event)
        elif kind.endswith("_started") and "op_id" in event:  # a graceful change begins: its saves stop training
            self.transition = str(event["op_id"])
            self.transition_reason = TRANSITION_REASONS.get(kind.removesuffix("_started"), "")
        elif kind in self.handlers:
            self.handlers[kind](event, ts)

    def disrupt(self, at: float, reason: str) -> bool:
        """Training stopped at `at`: the open stretch is closed as training, and a recovery begins."""
        if not self.training:
            return False
        self.close(at)
        self.training, self.stop_at, self.reason = False, at, reason
        return True

    def lost(self, event: Event, ts: float) -> None:
        self.nodes.left_at(str(event.get("node")), ts)
        self.disrupt(ts, NODE_LOSS)

    def crashed(self, event: Event, ts: float) -> None:
        """A worker exited with an error, or left its group on one (a peer died): everyone stops training."""
        if event.get("exit_code") not in (0, None) or event.get("error"):
            self.disrupt(ts, CRASH)

    def stopped(self, event: Event, _ts: float) -> None:
        last_step = event.get("last_step")
        if isinstance(last_step, int):
            self.high_step = max(self.high_step or 0, int(last_step))

    def waiting(self, _event: Event, ts: float) -> None:
        self.disrupt(ts, NODE_LOSS)
        self.waiting_since = self.waiting_since or ts

    def took_over(self, _event: Event, _ts: float) -> None:
        if not self.training:
            self.reason = TAKEOVER

    def job_end(self, _event: Event, ts: float) -> None:
        self.close(ts)
        self.ended = True

    def saved(self, event: Event, ts: float) -> None:
        duration = event.get("duration_s")
        if not isinstance(duration, int | float) or duration < 0:
            return
        self.saves.append((ts - float(duration), ts))
        self.last_save = ts
        if event.get("request_id") and event.get("request_id") == self.transition:
            self.disrupt(ts - float(duration), self.transition_reason)  # its ranks stopped to save

    def round_started(self, event: Event, ts: float) -> None:
        self.disrupt(ts, self.transition_reason)  # still training: its workers stop with the round
        if self.waiting_since is not None:
            self.waits.append((self.waiting_since, ts))
            self.waiting_since = None
        if self.reason in ("", START):  # named by the round unless a crash, a loss or a takeover named it
            self.reason = reason_of(event)
        world, rank_map = event.get("world_size"), event.get("rank_map")
        self.world = int(world) if isinstance(world, int | float) else 0
        self.nodes.round_ranks(rank_map if isinstance(rank_map, Mapping) else {}, ts)
        self.cause = str(event.get("cause") or "")
        self.transition = self.transition_reason = ""

    def first_step(self, event: Event, ts: float) -> None:
        if self.training:
            return
        self.close(ts)
        step = event.get("step")
        resumed = int(step) if isinstance(step, int) else None
        if self.first is not None and self.high_step is not None and self.stop_at is not None \
                and self.high_step > self.first[1]:  # how long the last round's steps took
            self.step_time = (self.stop_at - self.first[0]) / (self.high_step - self.first[1])
        if self.cause in FAILURES and resumed is not None and self.high_step is not None:
            redo = max(0, self.high_step - (resumed - 1))
            self.redone_steps += redo
            self.redo_s += redo * self.step_time
        self.training, self.stop_at, self.high_step = True, None, None
        self.last_save = self.last_save or ts
        self.first = (ts, resumed) if resumed is not None else None

    # -- stretches ------------------------------------------------------------------------------------
    def close(self, end: float) -> None:
        """Account the open stretch up to `end` and start the next one there."""
        split = self.split(end)
        self.redo_s -= split.seconds.get(REDONE, 0.0)
        for bucket, seconds in split.seconds.items():
            self.totals[bucket] = self.totals.get(bucket, 0.0) + seconds
            self.rank_totals[bucket] = self.rank_totals.get(bucket, 0.0) + seconds * split.ranks
        self.nodes.account(split.start, split.end, split.seconds)
        self.recent.append(split)
        while self.recent and self.recent[0].end < end - WINDOW_S:
            self.recent.popleft()
        self.mark, self.saves, self.waits = end, [s for s in self.saves if s[1] > end], []

    def split(self, end: float) -> Split:
        """The open stretch up to `end`, by bucket (it changes nothing)."""
        start = self.mark
        out = Split(start, end, self.world)
        if end <= start:
            return out
        saving = out.add(CHECKPOINT, overlap(self.saves, start, end))
        if self.training:
            redone = out.add(REDONE, min(self.redo_s, end - start - saving))
            out.add(TRAINING, end - start - saving - redone)
            return out
        waiting = out.add(WAITING, overlap(self.waits + ([(self.waiting_since, end)] if self.waiting_since else []),
                                           start, end))
        out.add(f"recovery.{self.reason}", end - start - saving - waiting)
        return out

    # -- reading --------------------------------------------------------------------------------------
    def live(self, now: float) -> Split:
        """The open stretch as it stands at `now` (nothing once the job ended)."""
        return self.split(now) if not self.ended else Split(now, now, self.world)

    def share(self, now: float, live: Split | None = None) -> float | None:
        """Goodput: training rank-seconds over all of the job's rank-seconds, the open stretch included."""
        live = live or self.live(now)
        training = self.rank_totals.get(TRAINING, 0.0) + live.seconds.get(TRAINING, 0.0) * live.ranks
        return ratio(training, sum(self.rank_totals.values()) + sum(live.seconds.values()) * live.ranks)

    def in_window(self, since: float, live: Split) -> list[Split]:
        """The stretches from `since` on, the open one (`live`) included, each clipped to it."""
        return [clip(s, since) for s in [*self.recent, live]]

    def window_share(self, now: float, seconds: float) -> float | None:
        """Goodput over the last `seconds` (at most WINDOW_S), the open stretch included."""
        splits = self.in_window(now - seconds, self.live(now))
        training = sum(s.seconds.get(TRAINING, 0.0) * s.ranks for s in splits)
        return ratio(training, sum(sum(s.seconds.values()) * s.ranks for s in splits))

    def report(self, now: float, nodes: int = -1) -> GoodputReply:
        """Seconds by bucket over the job's life and the last WINDOW_S, with goodput for each; the `nodes` nodes
        with the lowest goodput (all for a negative count); the window's timeline."""
        live = self.live(now)
        life = sum_splits([Split(self.started, self.mark, 0, dict(self.totals)), live])
        window = sum_splits(self.in_window(now - WINDOW_S, live))
        live_nodes = self.nodes.live(live.start, live.end, live.seconds)
        idle = sum(t.get(IDLE, 0.0) for t in [*self.nodes.totals.values(), *live_nodes.values()])
        by_node = self.nodes.report(live_nodes, nodes)
        return GoodputReply(life=described(life), window={**described(window), "seconds": WINDOW_S},
                            goodput=self.share(now, live), redone_steps=self.redone_steps,
                            wall_s=round(now - self.started, 3), nodes=by_node, idle_node_s=round(idle, 3),
                            timeline=timeline([*self.recent, live], max(self.started, now - WINDOW_S), now))

    def state(self) -> LedgerState:
        """What a `goodput` event carries: the closed totals, to resume from."""
        return {"totals": dict(self.totals), "rank_totals": dict(self.rank_totals), "started": self.started,
                "redone_steps": self.redone_steps, "last_save": self.last_save, **self.nodes.state()}

    def replay(self, events: list[JsonObject]) -> None:
        """A takeover: the job's log as adopted, from its start or its oldest kept `goodput` event on."""
        if events:
            self.started = self.mark = ts_of(events[0]) or self.started
        for event in events:
            self.observe(event, replay=True)

    def resume(self, event: Event) -> None:
        """A coordinator taking over: the totals of the last round's `goodput` event, and the job's start."""
        started, redone, last_save = event.get("started"), event.get("redone_steps"), event.get("last_save")
        self.totals, self.rank_totals = seconds_of(event.get("totals")), seconds_of(event.get("rank_totals"))
        self.started = float(started) if isinstance(started, int | float) and started else self.started
        self.redone_steps = int(redone) if isinstance(redone, int | float) else 0
        self.last_save = float(last_save) if isinstance(last_save, int | float) else None
        self.mark = ts_of(event)
        self.nodes.resume(event)
        self.recent.clear()


def reason_of(event: Event) -> str:
    """A round's cause, in the words of the recovery it ends."""
    cause, detail = event.get("cause"), str(event.get("detail") or "")
    if cause == Cause.start:
        return START
    if cause == Cause.hang:
        return HANG
    if cause == Cause.failure:
        return NODE_LOSS if "lost" in detail else CRASH
    if cause == Cause.membership:
        return JOIN if "join" in detail else LEAVE
    return OPERATOR


def clip(split: Split, since: float) -> Split:
    """The part of a stretch after `since`, its buckets scaled alike."""
    if split.start >= since or split.end <= split.start:
        return split
    share = max(0.0, split.end - since) / (split.end - split.start)
    return Split(max(split.start, since), split.end, split.ranks, {k: v * share for k, v in split.seconds.items()})


def timeline(splits: list[Split], start: float, end: float, bins: int = TIMELINE_BINS) -> GoodputTimeline:
    """Seconds by bucket in equal slices of [start, end] (at least 1 s each); a stretch is spread evenly over its
    slices: the timeline is as fine as the stretches, which end at each round's first step."""
    width = max((end - start) / bins, 1.0)
    out: list[dict[str, float]] = [{} for _ in range(max(1, min(bins, math.ceil((end - start) / width))))]
    for split in splits:
        span = split.end - split.start
        if span <= 0 or split.end <= start:
            continue
        first, last = max(0, int((split.start - start) // width)), min(len(out) - 1, int((split.end - start) // width))
        for i in range(first, last + 1):
            part = min(split.end, start + (i + 1) * width) - max(split.start, start + i * width)
            if part <= 0:  # the stretch ends exactly where this slice begins
                continue
            for bucket, seconds in split.seconds.items():
                out[i][bucket] = out[i].get(bucket, 0.0) + seconds * part / span
    return {"start": round(start, 3), "width_s": round(width, 3),
            "bins": [{k: round(v, 3) for k, v in b.items()} for b in out]}


def sum_splits(splits: list[Split]) -> dict[str, float]:
    out: dict[str, float] = {}
    for split in splits:
        for bucket, seconds in split.seconds.items():
            out[bucket] = out.get(bucket, 0.0) + seconds
    return out


def described(seconds: dict[str, float]) -> Buckets:
    """Buckets as `goodput` shows them: recovery by reason nested, and the share that was training."""
    recovery = {k.split(".", 1)[1]: round(v, 3) for k, v in seconds.items() if k.startswith("recovery.") and v > 5e-4}
    flat = {k: round(v, 3) for k, v in seconds.items() if not k.startswith("recovery.")}
    total = sum(seconds.values())
    return {"training": flat.get(TRAINING, 0.0), "checkpoint": flat.get(CHECKPOINT, 0.0),
            "redone": flat.get(REDONE, 0.0), "waiting": flat.get(WAITING, 0.0), "recovery": recovery,
            "accounted_s": round(total, 3),
            "training_share": ratio(seconds.get(TRAINING, 0.0), total)}


def ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole > 0 else None
