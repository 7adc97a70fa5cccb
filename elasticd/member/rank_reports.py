"""What this node's ranks last reported, by rank: the worker channel writes it, the node reads one round of it."""

from __future__ import annotations

import os
import statistics
from typing import TypedDict

from elasticd.wire.member_state import RankReport
from elasticd.wire.names import OUTPUT
from elasticd.wire.worker_reports import RankStep, Saved


class StepAnswer(TypedDict):
    """A node's answer to a step query."""

    step: int | None
    step_time: float | None


class RankReports:
    """Each rank's latest report (its hello, steps, saves, drain), kept until the next round.

    A worker of an old round may still be draining its queue: readers ask for one round's reports, and the
    worker channel writes only to a rank whose report is of the node's round (`has`).
    """

    def __init__(self) -> None:
        self._by_rank: dict[int, RankReport] = {}
        self._moved = False  # a step arrived since the last `st` telemetry message took them

    def take_moved(self) -> bool:
        """Whether a rank stepped since the last call: the `st` telemetry publishes only then."""
        moved, self._moved = self._moved, False
        return moved

    # -- what the worker channel writes -----------------------------------------------------------------
    def clear(self) -> None:
        """A new round: nothing reported in it yet."""
        self._by_rank = {}

    def hello(self, rank: int, round_id: int, now: float, in_place: bool) -> None:
        """A shim rank joined `round_id`: its hello counts as its last step until its first report."""
        self._by_rank[rank] = {"rank": rank, "round": round_id, "hello": now, "last_step_at": now,
                               "in_place": in_place}

    def has(self, rank: int, round_id: int) -> bool:
        report = self._by_rank.get(rank)
        return report is not None and report.get("round") == round_id

    def reads_output(self, rank: int, round_id: int, now: float) -> bool:
        """--metrics-from-output: whether the rank's steps come from its output lines (a report is begun for a rank
        with none in this round); False when it reports through the shim, whose reports win."""
        if not self.has(rank, round_id):
            self._by_rank[rank] = {"rank": rank, "round": round_id, "source": OUTPUT, "last_step_at": now}
        return self._by_rank[rank].get("source") == OUTPUT

    def last_step(self, rank: int) -> int:
        return self._by_rank[rank].get("step", 0)

    def step(self, reported: RankStep, now: float) -> bool:
        """A rank's step (its shim's report, or what its output said); True for the rank's first."""
        report = self._by_rank[reported.rank]
        first = "step" not in report
        self._moved = True
        elapsed = now - report["last_step_at"]
        report.update({"step": reported.step, "loss": reported.loss, "samples": reported.samples,
                       "tokens": reported.tokens, "step_time": reported.step_time, "dropped": reported.dropped,
                       "extra": reported.metrics, "last_step_at": now})
        if elapsed > 0 and reported.samples:
            report["throughput"] = round(reported.samples / elapsed, 2)
        return first

    def checkpoint(self, saved: Saved, now: float) -> None:
        self._by_rank[saved.rank]["last_checkpoint"] = {"step": saved.step, "path": saved.path, "bytes": saved.bytes,
                                                        "duration_s": saved.duration_s, "at": now}

    def checkpoint_folders(self) -> list[str]:
        """The local folders this node's ranks last saved to (health checks them; docs/health.md). A path that is
        not absolute (`s3://bucket/…`, DCP's other storage) is no folder of this host's."""
        paths = {str(r["last_checkpoint"].get("path") or "") for r in self._by_rank.values() if "last_checkpoint" in r}
        return sorted({os.path.dirname(p) for p in paths if os.path.isabs(p)})

    def drained(self, rank: int, step: int | None) -> None:
        self._by_rank[rank]["drained_step"] = step

    def ack(self, rank: int, request_id: str | None) -> None:
        self._by_rank[rank]["last_ack"] = request_id

    # -- what the node's readers read -------------------------------------------------------------------
    def of_round(self, round_id: int) -> list[RankReport]:
        """The round's reports, in the order their ranks first reported (`workers`, `st` telemetry, /metrics)."""
        return [r for r in self._by_rank.values() if r.get("round") == round_id]

    def by_rank(self, round_id: int) -> dict[str, RankReport]:
        """The round's reports keyed by rank as text: a heartbeat's `metrics`."""
        return {str(rank): r for rank, r in self._by_rank.items() if r.get("round") == round_id}

    def silent(self, round_id: int, now: float, limit_s: float) -> list[tuple[int, float]]:
        """(rank, seconds) of the round's ranks with no step for longer than `limit_s` (a hang, perhaps)."""
        found = []
        for rank, report in self._by_rank.items():
            silent = now - report.get("last_step_at", now)
            # a shim's steps, or a plain script's step lines (--metrics-from-output): either stopping is a hang
            if report.get("round") == round_id and silent > limit_s:
                found.append((rank, silent))
        return found

    def step_answer(self, round_id: int) -> StepAnswer:
        """This node's answer to a step query (the function below)."""
        return step_answer(self._by_rank, round_id)


def step_answer(reports: dict[int, RankReport], round_id: int) -> StepAnswer:
    """A node's reply to a step query: the highest step its shim ranks reported in this round, and their step time."""
    # A shim rank that said hello but whose first step report is still on its way counts as step 0: it is
    # a shim rank, so it must stop at the agreed step rather than be restarted (and lose what it trained).
    current = [r for r in reports.values() if r.get("round") == round_id and r.get("source") != OUTPUT
               and (r.get("step") is not None or "hello" in r)]  # steps read from output have no shim behind
    times = [float(t) for r in current if isinstance(t := r.get("step_time"), int | float)]
    return {"step": max((int(r.get("step") or 0) for r in current), default=None),
            "step_time": statistics.median(times) if times else None}
