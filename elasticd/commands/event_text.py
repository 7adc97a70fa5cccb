"""Each job event as one short English sentence, for `elasticd events` and the console; `--json` keeps the record."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from elasticd.commands.event_fields import (
    WORD_CHARS,
    Body,
    Name,
    clip,
    exit_text,
    fields_text,
    is_int,
    listed,
    number,
    percent,
    plural,
    ranks_text,
    seconds,
)
from elasticd.commands.render import format_bytes, short_path, span
from elasticd.wire.diagnosis import blocked
from elasticd.wire.names import EventKind, TransitionKind

SENTENCE_CHARS = 400  # the whole sentence, whatever the body
SHOWN_BY_CALLER = ("seq", "ts", "kind", "node")

Sentence = Callable[[Body], str]


# -- the coordinator's: membership, rounds, goodput, steering ---------------------------------------------
def node_joined(b: Body) -> str:
    via = f" via relay {b.node('via')}" if b.has("via") else ""
    slurm = b.sub("scheduler")
    restarts = slurm.fields.get("restart_count")
    requeued = f", requeued {plural(restarts, 'time')}" if is_int(restarts) and restarts else ""
    step = f"; {slurm.word('kind')} job {slurm.word('job_id')} step {slurm.word('step_id')}{requeued}" \
        if slurm.fields else ""
    return f"joined as {b.word('role')} with {b.count('nproc')} workers on {b.word('host')}{via}{step}"


def round_started(b: Body) -> str:
    rank_map = b.sub("rank_map").fields
    ranks = [f"{b.name_of(n)} {clip(span(sorted(filter(is_int, r))), WORD_CHARS)}"
             for n, r in rank_map.items() if isinstance(r, list)]
    in_place = ", in place" if b.fields.get("in_place") is True else ""
    return (f"round {b.count('round')} of world {b.count('world_size')} ({b.word('cause')}: {b.text('detail')})"
            f"{in_place}; ranks {listed(ranks)}")


def round_complete(b: Body) -> str:
    return f"round {b.count('round')} ({b.word('cause')}) spawned every worker: {b.timeline()} s"


def first_step(b: Body) -> str:
    step = f" from step {b.count('step')}" if b.has("step") else ""
    return f"round {b.count('round')} ({b.word('cause')}) trains{step}: {b.timeline()} s"


def straggler(b: Body) -> str:
    return (f"holds the others back {b.seconds('cost_s_per_step')} per {b.seconds('step_time_s')} step, for "
            f"{b.seconds('slow_for_s')}: its ranks wait {b.seconds('wait_s')}, the others {b.seconds('others_wait_s')}")


def goodput(b: Body) -> str:
    """goodput 87% over 12.3 s; lost: recovery (crash) 5.18 s, checkpoint 1.2 s; 40 steps redone."""
    totals, rank_totals = b.numbers("totals"), b.numbers("rank_totals")
    whole = sum(rank_totals.values())
    share = percent(rank_totals.get("training", 0.0) / whole) if whole > 0 else "-"
    lost = sorted(((s, k) for k, s in totals.items() if k != "training" and s >= 5e-4), reverse=True)
    buckets = [f"{bucket_name(k)} {seconds(s)}" for s, k in lost]
    redone = f"; {b.count('redone_steps')} steps redone" if number(b.fields.get("redone_steps")) else ""
    return f"goodput {share} over {seconds(sum(totals.values()))}; lost: {listed(buckets)}{redone}"


def bucket_name(bucket: str) -> str:
    """`recovery.crash` -> `recovery (crash)`; the other buckets by their own names."""
    name = clip(bucket, WORD_CHARS)
    return f"recovery ({name.removeprefix('recovery.')})" if name.startswith("recovery.") else name


def failure(b: Body) -> str:
    """What a failed rank's error says (`ValueError: bad batch at train.py:42 in step`); "" without one."""
    error = b.sub("error")
    what = ": ".join(text for text, key in ((error.word("type"), "type"), (error.text("message"), "message"))
                     if error.has(key))
    if not what and error.has("traceback"):
        what = error.text("traceback")
    where = f" at {error.word('where')}" if error.has("where") else ""
    return what + where if what else where.strip()


def ended_by(b: Body) -> str:
    if b.has("signal"):
        return f"signal {b.word('signal')}"
    return exit_text(b.fields.get("exit_code")) if b.has("exit_code") else ""


def job_end(b: Body) -> str:
    cause = b.sub("root_cause")
    said = failure(cause) or ended_by(cause)
    root = f"; root cause rank {cause.count('rank')} on {cause.node('node')}{': ' + said if said else ''}" \
        if cause.fields else ""
    return f"{b.word('state')}: {b.text('reason')}{root}"


def relay_replaced(b: Body) -> str:
    relay = b.node("relay") if b.has("relay") else "the coordinator"
    return f"relay gone: its {b.count('nodes')} members now send through {relay}"


def coordinator_elected(b: Body) -> str:
    previous = f", after {b.node('previous')}" if b.has("previous") else ", the first"
    return f"took over as coordinator (epoch {b.count('epoch')}) at round {b.count('restored_round')}{previous}"


def step_agreed(b: Body) -> str:
    if b.has("at_step"):
        return f"every rank will {b.word('op')} at step {b.count('at_step')}{b.op()}"
    return f"{b.word('op')} now: no rank reports steps{b.op()}"


def resize(b: Body) -> str:
    heal = b.sub("heal")
    moved = f"; heal moved {format_bytes(heal.number('received_bytes'))} in {heal.seconds('seconds')}" \
        if heal.fields else ""
    if heal.fields and heal.number("prepared_bytes"):
        moved += f" ({format_bytes(heal.number('prepared_bytes'))} into memory touched before)"
    went = f"stall {b.parts('parts')} s; " if b.has("parts") else ""  # first: the console shows a line's start
    return (f"generation {b.count('generation')} formed in place, world {b.count('world_size')} "
            f"({b.word('cause')}: {b.text('detail')}): {went}{b.timeline()} s{moved}")


# -- a node's own ---------------------------------------------------------------------------------------------
def worker_failed(b: Body) -> str:
    said, how = failure(b), ended_by(b)
    text = f"rank {b.count('rank')} failed{': ' + said if said else ''}{f' ({how})' if how else ''}"
    if b.fields.get("root_cause") is True:
        text += " — root cause"
    cause = b.sub("consequence_of")
    if cause.fields:
        text += f", a consequence of rank {cause.count('rank')} on node {cause.node('node')}"
    return text


def stuck_at(b: Body) -> str:
    """Where a stuck rank's stack says it was blocked, or why no stack was taken (`worker_hung`, `worker_not_left`)."""
    stack = b.sub("stack")
    return blocked(stack.word("where") if stack.has("where") else "",
                   b.text("stacks_note") if b.has("stacks_note") else "")


def worker_hung(b: Body) -> str:
    return f"rank {b.count('rank')} made no step for {b.seconds('silent_s')}{stuck_at(b)}"


def worker_not_left(b: Body) -> str:
    return f"rank {b.count('rank')} did not leave its group within {b.seconds('waited_s')}; replaced{stuck_at(b)}"


def workers_stopped(b: Body) -> str:
    by_exit: dict[str, list[int]] = {}
    for rank, code in b.sub("exit_codes").fields.items():
        if is_int(rank) or (isinstance(rank, str) and rank.isdecimal() and len(rank) < 19):
            by_exit.setdefault(exit_text(code), []).append(int(rank))
    exits = listed([f"{how} ({ranks_text(sorted(ranks))})" for how, ranks in by_exit.items()])
    at = f" at step {b.count('last_step')}" if b.has("last_step") else ""
    kept = b.fields.get("kept")
    in_place = f"; {len(kept)} kept in place" if isinstance(kept, list) else ""
    return f"round {b.count('round')} stopped{at}: {exits}{in_place}"


def workers_started(b: Body) -> str:
    kept = b.fields.get("kept")
    in_place = f", {len(kept)} kept in place" if isinstance(kept, list) and kept else ""
    return f"started {b.ranks('ranks')} of world {b.count('world_size')} for round {b.count('round')}{in_place}"


def checkpoint_saved(b: Body) -> str:
    path = f" to {short_path(b.text('path', 4 * WORD_CHARS))}" if b.has("path") else ""
    return (f"rank {b.count('rank')} saved step {b.count('step')}: {format_bytes(b.number('bytes'))} in "
            f"{b.seconds('duration_s')}{path}")


def key_refused(b: Body) -> str:
    who = f"key {b.word('key')}" if b.has("key") and b.fields.get("key") != "-" else "a connection"
    more = f"; {b.count('suppressed')} more since its last report" if number(b.fields.get("suppressed")) else ""
    why = f"{b.text('reason')}, {b.word('stage')} stage"
    return f"refused {who} from {b.word('peer')} on {b.word('domain')} ({why}){more}"


def command_received(b: Body) -> str:
    args = f": {fields_text(b.sub('args').fields)}" if b.has("args") else ""
    return f"{b.word('op')} from {b.word('by')}{args}"


# -- graceful transitions (the same four sentences for each kind) ---------------------------------------------
def started(b: Body) -> str:
    leaving = f"; leaving: {b.nodes('nodes')}" if b.has("nodes") else ""
    return f"{b.text('detail')}{leaving}{b.op()}"


def progress(b: Body) -> str:
    waiting = f"still waiting for {b.nodes('remaining')}" if b.has("remaining") else "no node left to wait for"
    return f"drained; {waiting}{b.op()}"


def complete(b: Body) -> str:
    timed_out = ", timed out waiting" if b.fields.get("timed_out") is True else ""
    out = f"; out: {b.nodes('nodes')}" if b.has("nodes") else ""
    return f"done in {b.seconds('duration_s')}{timed_out}{out}{b.op()}"


def abandoned(b: Body) -> str:
    return f"abandoned: {b.text('reason')}{b.op()}"


def generic(b: Body) -> str:
    return fields_text(b.fields, SHOWN_BY_CALLER)


SENTENCES: dict[str, Sentence] = {
    EventKind.node_joined: node_joined,
    EventKind.node_left: lambda b: f"left: {b.text('reason')}",
    EventKind.node_lost: lambda b: f"lost: {b.text('reason')}",
    EventKind.node_role: lambda b: f"now {b.word('role')}",
    EventKind.node_done: lambda b: f"every worker of round {b.count('round')} finished",
    EventKind.waiting: lambda b: f"{b.text('reason')}; join timeout {b.seconds('join_timeout_s')}",
    EventKind.round_started: round_started,
    EventKind.round_complete: round_complete,
    EventKind.first_step: first_step,
    EventKind.straggler: straggler,
    EventKind.straggler_cleared: lambda b: f"no longer a straggler: {b.text('reason')}",
    EventKind.goodput: goodput,
    EventKind.goodput_low: lambda b: f"goodput {percent(b.number('goodput'))} over the last "
                                     f"{b.seconds('window_s')}, under the {percent(b.number('floor'))} floor",
    EventKind.checkpoint_stale: lambda b: f"the newest checkpoint is {b.seconds('age_s')} old, over the "
                                          f"{b.seconds('max_age_s')} limit",
    EventKind.stop_barrier_timeout: lambda b: f"round {b.count('round')} starts without waiting longer for the "
                                              f"old workers on {b.nodes('nodes')}",
    EventKind.job_end: job_end,
    EventKind.relay_replaced: relay_replaced,
    EventKind.node_unhealthy: lambda b: f"unhealthy ({b.texts('reasons')}): {b.text('action')}",
    EventKind.node_healthy: lambda b: f"its checks pass again; {b.word('role')} until `elasticd uncordon`",
    EventKind.coordinator_elected: coordinator_elected,
    EventKind.etcd_unreachable: lambda b: f"etcd unreachable ({b.text('detail')}): membership frozen, the job "
                                          f"stops after {b.seconds('outage_limit_s')}",
    EventKind.etcd_restored: lambda b: f"etcd answers again ({b.text('detail')})",
    EventKind.scale_set: lambda b: f"scale to {b.count('target')} nodes; joining: {b.nodes('joining')}",
    EventKind.checkpoint_requested: lambda b: f"checkpoint requested{b.op()}",
    EventKind.step_agreed: step_agreed,
    EventKind.interlock_refused: lambda b: f"{b.word('op')} refused: {b.text('reason')}",
    **{f"{kind}_{phase}": sentence for kind in TransitionKind
       for phase, sentence in (("started", started), ("progress", progress), ("complete", complete),
                               ("abandoned", abandoned))},
    EventKind.resize: resize,
    EventKind.resize_failed: lambda b: f"generation {b.count('generation')} failed in place, a restart follows: "
                                       f"{b.text('reason')}",
    EventKind.workers_started: workers_started,
    EventKind.workers_stopped: workers_stopped,
    EventKind.worker_exited: lambda b: f"rank {b.count('rank')} exited with "
                                       f"{exit_text(b.fields.get('exit_code'))} (pid {b.count('pid')})",
    EventKind.worker_exit_timeout: lambda b: f"{b.ranks('ranks')} still ran {b.seconds('timeout_s')} after a "
                                             f"peer finished: stopped",
    EventKind.worker_killed: lambda b: f"rank {b.count('rank')} killed: {b.text('reason')}",
    EventKind.worker_failed: worker_failed,
    EventKind.worker_hung: worker_hung,
    EventKind.worker_not_left: worker_not_left,
    EventKind.worker_left: lambda b: f"rank {b.count('rank')} left its process group at step {b.count('step')}: "
                                     f"{b.text('error')}",
    EventKind.checkpoint_saved: checkpoint_saved,
    EventKind.checkpoint_skipped: lambda b: f"rank {b.count('rank')} skipped "
                                            f"{short_path(b.text('path', 4 * WORD_CHARS))}: {b.text('reason')}",
    EventKind.command_received: command_received,
    EventKind.unauthorized: lambda b: f"{b.word('op')} from {b.word('by')} refused: {b.text('reason')}",
    EventKind.key_refused: key_refused,
}


def describe(event: Mapping[str, object], name: Name = str) -> str:
    """The event's body as one short line (its time, seq, node and kind are the caller's to print beside it)."""
    body = Body(event, name)
    kind = body.fields.get("kind")
    sentence = SENTENCES.get(kind, generic) if isinstance(kind, str) else generic
    try:
        text = sentence(body)
    except Exception:  # a sentence's bug on a record it did not expect: the record's fields still read
        text = generic(body)
    return clip(" ".join(text.split()), SENTENCE_CHARS)


def line(event: Mapping[str, object]) -> str:
    """`HH:MM:SS #seq [node] kind sentence`: one job event as `events` prints it and `events --follow` streams it."""
    stamp = time.strftime("%H:%M:%S", time.localtime(number(event.get("ts")) or 0.0))
    return f"{stamp} #{event.get('seq')} [{event.get('node')}] {event.get('kind')} {describe(event)}".rstrip()
