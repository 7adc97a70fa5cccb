"""The loss view: loss over steps, one line per node (mean of its ranks) or job-wide."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from tui.model import JobModel


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


class LossView(PlotextPlot):
    """`/job` plots the job-wide mean; `/NODE` one node."""

    def __init__(self) -> None:
        super().__init__(id="loss")
        self.drawn: object = None

    def show(self, model: JobModel, marks: set[str], pattern: str) -> None:
        series = loss_series(model, pattern)
        key = (pattern, {k: (len(v[0]), v[0][-1:]) for k, v in series.items()})
        if key == self.drawn:
            return
        self.drawn = key
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(f"loss over steps ({'job-wide' if pattern == 'job' else 'per node'})")
        plt.xlabel("step")
        for node_id, (steps, losses) in series.items():
            plt.plot(steps, losses, label=node_id, marker="braille")
        self.refresh()
