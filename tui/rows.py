"""Table rows for each view, computed from the job model as rich Text; no Textual widgets here."""

from __future__ import annotations

import re
from collections.abc import Callable

from rich.text import Text

from elasticd.commands.event_fields import timeline_text
from elasticd.commands.event_text import describe
from elasticd.commands.render import format_seconds, short_path
from elasticd.commands.render import span as span_text
from tui.liveness import SPARK_WIDTH, format_age, format_bytes, sparkline
from tui.model import JobModel, NodeView

Row = tuple[str, list[Text | str]]
Names = dict[str, str]  # node id -> the name shown (tui/names.py)
LIVENESS_STYLE = {"live": "green", "stale": "yellow", "missing": "bold red", "lost": "red", "left": "dim"}
ROLE_STYLE = {"active": "green", "standby": "cyan", "draining": "yellow", "cordoned": "magenta"}
NODE_COLOURS = ("dodger_blue2", "dark_orange", "medium_purple", "spring_green3", "deep_pink3", "gold3",
                "turquoise2", "salmon1")
CKPT_STALE_S = 600.0
NODE_COLUMNS = ("", "node", "host", "role/state", "cause", "wrk", "ranks", "step", "loss", "trend", "thr/s", "ckpt",
                "heartbeat", "cpu%", "rss", "rst")
NODE_WIDTHS = (1, 6, 12, 15, 0, 3, 5, 6, 6, 10, 6, 6, 11, 4, 6, 3)
CKPT_COLUMNS = ("rank", "node", "saved step", "age", "size", "took", "path")
EVENT_COLUMNS = ("seq", "time", "node", "kind", "details")
PHASES = ("detect", "rendezvous", "stopped", "spawned", "first_step")
NAME_SHARE = 6  # a node column of the events and ckpt tables gets a sixth of the width, 12 cells at least
NAME_MIN = 12
MEMBERS_SHOWN = 32  # members of a round named in the ranks view's history


def name_width(total: int) -> int:
    """How wide node names may be in a column (or a line) that shares `total` cells with others."""
    return max(NAME_MIN, total // NAME_SHARE)


def node_colour(model: JobModel, node_id: str) -> str:
    index = model.node_order.get(node_id)
    return NODE_COLOURS[index % len(NODE_COLOURS)] if index is not None else "white"


def matches(pattern: str, *cells: object) -> bool:
    """Filter text: a regex (case-insensitive), `!` in front inverts; a bad regex matches literally."""
    if not pattern:
        return True
    invert, pattern = pattern.startswith("!"), pattern.removeprefix("!")
    haystack = " ".join(str(c) for c in cells)
    try:
        found = re.search(pattern, haystack, re.IGNORECASE) is not None
    except re.error:
        found = pattern.lower() in haystack.lower()
    return found != invert


def node_row(model: JobModel, node: NodeView, marked: bool, names: Names) -> list[Text | str]:
    # a node out of the round (standby, draining, lost) keeps its ranks' last reports: they are not live
    ranks = model.node_ranks(node.node_id) if model.in_round(node) else []
    steps = [m.step for m in ranks if m.step is not None]
    losses = [m.loss for m in ranks if m.loss is not None]
    throughput = sum(m.throughput or 0.0 for m in ranks)
    saved = [m.checkpoint_at for m in model.node_ranks(node.node_id) if m.checkpoint_at is not None]
    ckpt_age = model.clock() - min(saved) if saved else None
    live = model.node_liveness(node)
    running = sum(1 for w in node.workers if w.get("state") == "running")
    cpu = sum(float(w.get("cpu_percent") or 0) for w in node.workers)
    rss = sum(int(w.get("rss") or 0) for w in node.workers)
    role = node.role or "?"
    state = node.daemon_state or node.status
    cause = model.recent_cause(node.node_id)
    return [
        Text("●" if marked else " ", style="bold yellow"),
        Text(names.get(node.node_id, node.node_id), style=f"bold {node_colour(model, node.node_id)}"),
        node.host or "-",
        Text(f"{role}/{state}", style=ROLE_STYLE.get(role, "")) + (
            Text(" SLOW", style="bold red") if node.node_id in model.stragglers else Text()) + (
            Text(f" spare {node.spare}", style="green" if node.spare == "ready" else "yellow")
            if node.spare else Text()),
        Text(f"UNHEALTHY {'; '.join(node.health)}", style="bold red", overflow="ellipsis") if node.health
        else Text(cause.brief, style="bold red", overflow="ellipsis") if cause else "",
        f"{running}/{len(node.workers)}" if node.workers else "-",
        span_text(node.ranks),
        str(max(steps)) if steps else "-",
        f"{sum(losses) / len(losses):.4f}" if losses else "-",
        Text(sparkline(recent_losses(node)), style="cyan"),
        f"{throughput:.1f}" if throughput else "-",
        Text(format_age(ckpt_age), style="bold red" if ckpt_age and ckpt_age > CKPT_STALE_S else ""),
        Text(f"{live} {format_age(model.heartbeat_age(node))}", style=LIVENESS_STYLE.get(live, "")),
        f"{cpu:.0f}" if node.workers else "-",
        format_bytes(rss) if node.workers else "-",
        str(node.restarts),
    ]


def recent_losses(node: NodeView, count: int = SPARK_WIDTH) -> list[float]:
    """The last `count` losses of a node, without copying its whole history."""
    history = node.loss_history
    return [history[i][1] for i in range(max(0, len(history) - count), len(history))]


def node_rows(model: JobModel, marks: set[str], names: Names, pattern: str = "") -> list[Row]:
    rows: list[Row] = []
    for node in model.nodes.values():
        cells = node_row(model, node, node.node_id in marks, names)
        if matches(pattern, node.node_id, *cells):  # the whole id: a filter may name what the column elides
            rows.append((node.node_id, cells))
    return rows


def node_keys(model: JobModel) -> list[str]:
    """The nodes view's row keys when no filter is set: its cells can then be computed for visible rows only."""
    return model.row_keys()


PENDING_ROW: list[Text | str] = [" ", Text("…", style="dim"), "", Text("fetching", style="dim")]  # no page yet


def node_cells(model: JobModel, marks: set[str], names: Names) -> Callable[[str], list[Text | str]]:
    def cells(node_id: str) -> list[Text | str]:
        node = model.nodes.get(node_id)
        return node_row(model, node, node_id in marks, names) if node is not None else PENDING_ROW

    return cells


def age_text(age: float | None) -> Text:
    return Text(format_age(age), style="bold red" if age and age > CKPT_STALE_S else "")


def job_checkpoint_row(model: JobModel, names: Names) -> Row:
    """The job's line: its newest checkpoint, whichever rank and node wrote it."""
    newest = model.newest_checkpoint
    if newest is None:
        return "job", [Text("job", style="bold"), "-", "-", age_text(None), "-", "-", "no checkpoint yet"]
    return "job", [Text("job", style="bold"), Text(names.get(newest.node, newest.node), style="bold"),
                   "-" if newest.checkpoint_step is None else str(newest.checkpoint_step),
                   age_text(model.checkpoint_age()), "-", "-", f"newest: rank {newest.rank}"]


def checkpoint_rows(model: JobModel, names: Names, pattern: str = "") -> list[Row]:
    rows: list[Row] = [job_checkpoint_row(model, names)]
    for metrics in sorted(model.rank_metrics.values(), key=lambda m: m.rank):
        age = model.clock() - metrics.checkpoint_at if metrics.checkpoint_at is not None else None
        cells: list[Text | str] = [
            str(metrics.rank), Text(names.get(metrics.node, metrics.node), style=node_colour(model, metrics.node)),
            "-" if metrics.checkpoint_step is None else str(metrics.checkpoint_step), age_text(age),
            format_bytes(metrics.checkpoint_bytes), format_seconds(metrics.checkpoint_duration_s),
            short_path(metrics.checkpoint_path) if metrics.checkpoint_path else "-"]
        if matches(pattern, metrics.node, *cells):
            rows.append((str(metrics.rank), cells))
    return rows


def event_rows(model: JobModel, names: Names, pattern: str = "", limit: int = 500) -> list[Row]:
    import time as _time

    rows: list[Row] = []
    for event in reversed(model.events):
        kind = str(event.get("kind", ""))
        style = ("bold red" if "fail" in kind or "lost" in kind or kind == "interlock_refused"
                 else "green" if kind in ("round_complete", "first_step") else "")
        stamp = _time.strftime("%H:%M:%S", _time.gmtime(float(event.get("ts", 0))))
        node_id = str(event.get("node", ""))
        cells: list[Text | str] = [str(event.get("seq", "")), stamp, names.get(node_id, node_id),
                                   Text(kind, style=style), describe(event, lambda n: names.get(n, n))[:160]]
        if matches(pattern, node_id, *cells):
            rows.append((str(event.get("seq", len(rows))), cells))
        if len(rows) >= limit:
            break
    return rows


def history_rows(model: JobModel, names: Names) -> list[Row]:
    rows: list[Row] = []
    for rnd in reversed(model.round_history):
        every = rnd.get("members", [])
        members = " ".join(f"{names.get(str(m.get('node_id')), m.get('node_id'))}:{span_text(list(m.get('ranks', [])))}"
                           for m in every[:MEMBERS_SHOWN])
        if len(every) > MEMBERS_SHOWN:  # a line shows a few dozen at most: 2,048 would cost every frame
            members += f" … +{len(every) - MEMBERS_SHOWN}"
        marks = rnd.get("timeline", {})
        timeline = {p: float(marks[p]) - float(marks.get("detect", 0)) for p in PHASES if p in marks}
        rows.append((str(rnd.get("round_id")), [str(rnd.get("round_id")), str(rnd.get("cause", "")),
                                                str(rnd.get("world_size", "")), members, timeline_text(timeline)]))
    return rows
