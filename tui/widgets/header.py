"""The job header: job, state, round, world/target/min:max, restarts by cause, goodput, last recovery, liveness."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.liveness import format_age
from tui.model import JobModel
from tui.rows import CKPT_STALE_S, name_width

GOOD_SHARE = 0.9  # below this the header's goodput is marked: Llama 3's fleet kept > 90 % through 419 failures
STATE_STYLE = {"running": "bold green", "waiting": "bold yellow", "succeeded": "bold cyan", "failed": "bold red",
               "stopped": "bold magenta", "connecting": "yellow"}


def header_text(model: JobModel, readonly: bool, jobs: list[str], view: str, width: int = 120) -> Text:
    job = model.job
    text = Text()
    if len(jobs) > 1:
        for job_id in jobs:
            text.append(f" {job_id} ", style="reverse bold" if job_id == job.job_id else "dim")
        text.append("  ([ ] or :job ID)\n", style="dim")
    text.append(f"job {job.job_id or '?'} ", style="bold").append(job.state, STATE_STYLE.get(job.state, "")).append(" ")
    text.append(f"  round {job.round}{' in place' if model.round_in_place.get(job.round) else ''}  "
                f"world {job.world_size}  target {job.target} nodes  "
                f"min:max {job.min_nodes}:{job.max_nodes}  "
                f"coordinator {model.short_name(job.coordinator, name_width(width)) if job.coordinator else '?'}"
                + (f" (epoch {job.epoch})" if job.epoch else ""))
    if readonly:
        text.append("  READ-ONLY", style="bold reverse yellow")
    restarts = " ".join(f"{cause} {count}" for cause, count in job.restarts.items())
    text.append(f"\nrestarts: {restarts or '-'} (max {job.max_restarts})  ")
    if job.goodput is not None:
        text.append("goodput ").append(f"{job.goodput:.1%}", "bold" if job.goodput >= GOOD_SHARE else "bold yellow")
        text.append("  ")
    if job.last_recovery:
        phase, total = max(job.last_recovery.items(), key=lambda kv: kv[1])
        text.append(f"last recovery {total:.2f}s (to {phase})  ")
    age = model.checkpoint_age()
    text.append("ckpt ").append(format_age(age), "bold red" if age is not None and age > CKPT_STALE_S else "")
    text.append(" ago  " if age is not None else "  ")
    text.append(daemon_counts(model))
    if model.connection != "connected":
        text.append(f"  {model.connection}", style="bold red")
    text.append(f"\nview :{view}", style="bold cyan")
    if job.reason:
        text.append(f"  {job.reason}", style="yellow")
    return text


def daemon_counts(model: JobModel) -> str:
    """Daemons by liveness as this console sees them; a large job's by role and status, from `status`."""
    if model.paged:
        counts = {k: v for k, v in model.node_counts.items() if v}
        return f"daemons {model.nodes_total}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    counts = {}
    for node in model.nodes.values():
        live = model.node_liveness(node)
        counts[live] = counts.get(live, 0) + 1
    return "daemons: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))


class JobHeader(Static):
    """Three lines at the top (four with several jobs)."""

    DEFAULT_CSS = """
    JobHeader { height: auto; background: $primary-background; padding: 0 1; }
    """

    shown: Text | None = None

    def show(self, text: Text) -> None:
        """Update only when the text changed: an update re-lays out the screen (the header's height is auto)."""
        if text != self.shown:
            self.shown = text
            self.update(text)
