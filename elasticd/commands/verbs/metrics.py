"""`metrics`: step, loss, throughput and checkpoint age per rank, from trainer_shim reports."""

from elasticd.commands.port import JobPort
from elasticd.commands.verb import Command
from elasticd.wire.names import STEP_WAIT_METRIC
from elasticd.wire.read_replies import MetricsReply, RankRow
from elasticd.wire.verb_requests import VerbRequest


def read(c: JobPort, request: VerbRequest) -> MetricsReply:
    now = c.clock()
    ranks: list[RankRow] = []
    for node in c.alive():
        for data in node.metrics.values():
            if not isinstance(data, dict):
                continue
            ckpt = data.get("last_checkpoint") or {}
            extra = data.get("extra")  # a shim rank's extra metrics: its smoothed allreduce wait among them
            ranks.append({
                "node": node.node_id, "rank": data.get("rank"), "round": data.get("round"),
                "step": data.get("step"), "loss": data.get("loss"), "throughput": data.get("throughput"),
                "step_age_s": round(now - data.get("last_step_at", now), 2), "dropped": data.get("dropped", 0),
                "checkpoint_step": ckpt.get("step"), "checkpoint_path": ckpt.get("path"),
                "checkpoint_bytes": ckpt.get("bytes"), "checkpoint_duration_s": ckpt.get("duration_s"),
                "checkpoint_age_s": round(now - ckpt["at"], 2) if ckpt.get("at") else None,
                "wait_s": extra.get(STEP_WAIT_METRIC) if isinstance(extra, dict) else None,
            })
    return MetricsReply(ranks=sorted(ranks, key=lambda r: (r["rank"] is None, r["rank"])))


def render(result: MetricsReply) -> str:
    lines = [f"{'NODE':<10} {'RANK':>4} {'STEP':>7} {'LOSS':>10} {'SAMPLES/S':>10} {'CKPT AGE':>9}"]
    for r in result.ranks:
        loss = f"{r['loss']:.4f}" if isinstance(r.get("loss"), int | float) else "-"
        age = f"{r['checkpoint_age_s']:.1f}s" if r.get("checkpoint_age_s") is not None else "-"
        lines.append(f"{r['node']:<10} {r['rank']!s:>4} {r['step']!s:>7} {loss:>10} {r.get('throughput') or '-'!s:>10} "
                     f"{age:>9}")
    return "\n".join(lines)


COMMANDS = [Command("metrics", "step, loss, throughput, checkpoint age per rank", VerbRequest, order=50, read=read,
                    reply=MetricsReply, render=render)]
