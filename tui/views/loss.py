"""The loss view: loss over steps, one line per node (mean of its ranks) or job-wide, rounds marked on the steps."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from tui.model import JobModel
from tui.rows import name_width

Mark = tuple[int, str, bool]  # step, label, whether the world size changed there
MAX_MARKS = 12  # the newest rounds in view: more labels would not fit under the axis


def loss_series(model: JobModel, pattern: str = "") -> dict[str, tuple[list[int], list[float]]]:
    """node id -> (steps, losses); the filter picks nodes by name, `job` gives the job-wide mean."""
    series: dict[str, tuple[list[int], list[float]]] = {}
    merged: dict[int, list[float]] = {}
    for node in model.nodes.values():
        by_step: dict[int, list[float]] = {}
        for step, loss in node.loss_history:
            by_step.setdefault(step, []).append(loss)
            merged.setdefault(step, []).append(loss)
        if by_step and (not pattern or pattern in node.node_id):
            steps = sorted(by_step)
            series[node.node_id] = (steps, [sum(by_step[s]) / len(by_step[s]) for s in steps])
    if pattern == "job" and merged:
        steps = sorted(merged)
        series = {"job": (steps, [sum(merged[s]) / len(merged[s]) for s in steps])}
    return series


def round_marks(model: JobModel, low: int, high: int) -> list[Mark]:
    """Where each round began on the step axis (its first step seen): `120 r3`, or `120 r3 4→2` on a resize."""
    marks: list[Mark] = []
    size = None
    for round_id in sorted(model.round_first_step):
        world = model.round_sizes.get(round_id)
        resized = size is not None and world is not None and world != size
        step = model.round_first_step[round_id]
        if low <= step <= high:
            label = f"{step} r{round_id}" + (f" {size}→{world}" if resized else "")
            marks.append((step, label, resized))
        size = world if world is not None else size
    return marks[-MAX_MARKS:]


class LossView(PlotextPlot):
    """`/job` plots the job-wide mean; `/NODE` one node; `l` switches the loss axis to a log scale and back."""

    def __init__(self) -> None:
        super().__init__(id="loss")
        self.drawn: object = None
        self.log_scale = False

    def show(self, model: JobModel, marks: set[str], pattern: str) -> None:
        series = loss_series(model, pattern)
        steps = [s for xs, _ in series.values() for s in (xs[0], xs[-1])]
        rounds = round_marks(model, min(steps), max(steps)) if steps else []
        key = (pattern, self.log_scale, rounds, {k: (len(v[0]), v[0][-1:]) for k, v in series.items()})
        if key == self.drawn:
            return
        self.drawn = key
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        positive = all(loss > 0 for _, losses in series.values() for loss in losses)
        scale = "log" if self.log_scale and positive else "linear"
        said = "log scale" if scale == "log" else "linear (log needs loss > 0)" if self.log_scale else "linear"
        plt.title(f"loss over steps, {'job-wide' if pattern == 'job' else 'per node'}: {said} (l toggles); "
                  "| round starts, orange = resized")
        plt.xlabel("step")
        plt.yscale(scale)
        names = model.short_names(name_width(self.size.width or self.app.size.width))
        for node_id, (xs, losses) in series.items():
            plt.plot(xs, losses, label=names.get(node_id, node_id), marker="braille")
        for step, _, resized in rounds:
            plt.vline(step, "orange" if resized else "gray")
        if rounds:
            plt.xticks([step for step, _, _ in rounds], [label for _, label, _ in rounds])
        self.refresh()
