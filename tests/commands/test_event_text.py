"""Every event kind as a short sentence (elasticd/commands/event_text.py): realistic bodies, the new failure fields,
and garbage that must still give one bounded line."""

from __future__ import annotations

from typing import Any

import pytest

from elasticd.commands.event_fields import Body
from elasticd.commands.event_text import SENTENCE_CHARS, SENTENCES, describe
from elasticd.commands.render import format_seconds, short_path, significant
from elasticd.wire.names import EventKind, TransitionKind

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

TIMELINE = {"detect": 0.0, "rendezvous": 0.103, "stopped": 0.154, "go": 0.16, "spawned": 0.184, "first_step": 2.31}
ERROR = {"type": "ValueError", "message": "bad batch", "where": "train.py:42 in step", "source": "error_file",
         "traceback": 'Traceback (most recent call last):\n  File "train.py", line 42, in step\nValueError: bad batch'}
CKPT = "/mnt/shared/checkpoints/experiments/llama-7b-run-42/step-000200/rank-00017.pt"
GOODPUT = {"totals": {"training": 6.7, "recovery.start": 5.176224946975708, "checkpoint": 0.41},
           "rank_totals": {"training": 26.8, "recovery.start": 3.9, "checkpoint": 0.1},
           "started": 1795305600.0, "redone_steps": 0, "last_save": 1795305611.2,
           "node_totals": {"a": {"training": 6.7, "recovery.start": 5.18}, "b": {"training": 6.7, "idle": 1.0}},
           "node_joined": {"a": 1795305600.0, "b": 1795305600.4}}

# A body per kind, as the code that emits it sends it (grep `EventKind.<kind>` in elasticd/).
SAMPLES: dict[str, dict[str, Any]] = {
    EventKind.node_joined: {"host": "node-b.example", "nproc": 2, "role": "active", "via": "a",
                            "scheduler": {"kind": "slurm", "job_id": "4242", "step_id": "0", "restart_count": 1}},
    EventKind.node_left: {"reason": "node b left (SIGTERM)"},
    EventKind.node_lost: {"reason": "node b missed 3 heartbeats"},
    EventKind.node_role: {"role": "draining"},
    EventKind.node_done: {"round": 2},
    EventKind.waiting: {"reason": "waiting for 1 more node(s): 1 active, --nnodes min is 2", "join_timeout_s": 600.0},
    EventKind.round_started: {"round": 2, "world_size": 4, "cause": "failure", "detail": "rank 3 exited 1",
                              "rank_map": {"a": [0, 1], "b": [2, 3]}, "in_place": False},
    EventKind.round_complete: {"round": 2, "cause": "failure", "timeline": TIMELINE},
    EventKind.first_step: {"round": 2, "cause": "failure", "timeline": TIMELINE, "step": 240},
    EventKind.node_unhealthy: {"reasons": ["xid: GPU 3: XID 79 (fallen off the bus)", "ecc: GPU 3: uncorrectable "
                                                                                    "ECC errors 0 -> 2"],
                               "action": "cordon: it leaves at one agreed step; a spare takes its place if the job "
                                         "has one"},
    EventKind.node_healthy: {"checks": ["command", "xid", "ecc", "log_dir"], "role": "cordoned"},
    EventKind.straggler: {"wait_s": 0.0012, "others_wait_s": 0.0831, "cost_s_per_step": 0.0819, "step_time_s": 0.2,
                          "slow_for_s": 10.2},
    EventKind.straggler_cleared: {"reason": "its ranks no longer hold the others back"},
    EventKind.goodput: GOODPUT,
    EventKind.goodput_low: {"goodput": 0.61, "floor": 0.8, "window_s": 600.0},
    EventKind.checkpoint_stale: {"age_s": 1830.4, "max_age_s": 1800.0, "saved_at": 1795305600.0},
    EventKind.stop_barrier_timeout: {"round": 3, "nodes": ["b", "c"]},
    EventKind.job_end: {"state": "failed", "reason": "worker rank 3 on node b exited with exit code 1",
                        "root_cause": {"node": "b", "rank": 3, "round": 2, "exit_code": 1, "error": ERROR,
                                       "root_cause": True}},
    EventKind.relay_replaced: {"relay": "c", "nodes": 12},
    EventKind.coordinator_elected: {"epoch": 3, "previous": "a", "restored_round": 4},
    EventKind.etcd_unreachable: {"detail": "no endpoint answered", "outage_limit_s": 300.0},
    EventKind.etcd_restored: {"detail": "etcd-0 answered", "outage_limit_s": 300.0},
    EventKind.scale_set: {"target": 3, "joining": ["c"]},
    EventKind.checkpoint_requested: {"op_id": "9ae6b97fc3f8495a"},
    EventKind.step_agreed: {"op_id": "9ae6b97fc3f8495a", "op": "drain", "at_step": 260},
    EventKind.interlock_refused: {"op": "drain", "reason": "would leave 1 node(s), below --nnodes min 2; use --force"},
    **{f"{kind}_started": {"op_id": "9ae6b97fc3f8495a", "nodes": ["b"], "detail": f"{kind} of b"}
       for kind in TransitionKind},
    **{f"{kind}_progress": {"op_id": "9ae6b97fc3f8495a", "remaining": ["c"]} for kind in TransitionKind},
    **{f"{kind}_complete": {"op_id": "9ae6b97fc3f8495a", "nodes": ["b"], "timed_out": False, "duration_s": 12.3456}
       for kind in TransitionKind},
    **{f"{kind}_abandoned": {"op_id": "9ae6b97fc3f8495a", "reason": "a new round started first"}
       for kind in TransitionKind},
    EventKind.resize: {"generation": 5, "round": 5, "world_size": 6, "cause": "membership", "detail": "node c joined",
                       "timeline": {"detect": 0.0, "agreed": 0.2, "left": 0.3, "group_ready": 1.1, "synced": 1.9,
                                    "first_step": 2.2},
                       "heal": {"received_bytes": 3 << 30, "sent_bytes": 3 << 30, "seconds": 0.42, "plan_s": 0.02,
                                "transfer_s": 0.4, "fallback": None},
                       "parts": {"leave": 0.3, "group": 0.8, "rebuild": 0.3, "plan": 0.02, "transfer": 0.4,
                                 "first_step": 0.3, "other": 0.08}},
    EventKind.resize_failed: {"generation": 5, "round": 5,
                              "reason": "not every rank of generation 5 synced within 30s"},
    EventKind.workers_started: {"round": 2, "ranks": [0, 1], "world_size": 4, "pids": [1003, 1004], "kept": []},
    EventKind.workers_stopped: {"round": 1, "exit_codes": {"0": 0, "1": 0, "3": -15}, "last_step": 240},
    EventKind.worker_exited: {"round": 1, "rank": 3, "pid": 2002, "exit_code": -9},
    EventKind.worker_exit_timeout: {"round": 1, "ranks": [1, 2], "timeout_s": 300.0},
    EventKind.worker_killed: {"rank": 3, "reason": "operator drill"},
    EventKind.worker_failed: {"rank": 3, "round": 2, "exit_code": 1, "error": ERROR, "root_cause": True},
    EventKind.worker_hung: {"rank": 1, "silent_s": 6.2,
                            "stack": {"where": "train.py:17 in wait_forever",
                                      "text": 'Thread 0x1 (most recent call first):\n  File "train.py", line 17'}},
    EventKind.worker_not_left: {"rank": 2, "pid": 3003, "waited_s": 13.0,
                                "stack": {"where": "train.py:40 in step",
                                          "text": 'Thread 0x1 (most recent call first):\n  File "train.py", line 40'}},
    EventKind.worker_left: {"round": 4, "rank": 2, "pid": 3003, "step": 118,
                            "error": "NCCL communicator was aborted on rank 2"},
    EventKind.checkpoint_saved: {"rank": 3, "step": 200, "bytes": 48_000_000, "duration_s": 0.049312345,
                                 "path": CKPT, "request_id": None},
    EventKind.checkpoint_skipped: {"rank": 0, "path": "/ckpt/step-180/rank-0.pt", "reason": "torn: no manifest"},
    EventKind.command_received: {"op": "drain", "by": "alice (operator)",
                                 "args": {"nodes": ["b"], "dry_run": False, "force": False}},
    EventKind.unauthorized: {"op": "drain", "by": "viewer-1", "reason": "role viewer cannot steer"},
    EventKind.key_refused: {"domain": "control", "peer": "10.0.0.7", "stage": "key", "reason": "Unknown key",
                            "key": "rq:7Hn2x", "suppressed": 4, "refused_keys": 9},
    EventKind.unknown: {"detail": "an event without a kind", "count": 2},
}


def event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"seq": 7, "ts": 1795305700.0, "kind": kind, "node": "a", **fields}


def one_line(text: str) -> bool:
    return isinstance(text, str) and "\n" not in text and len(text) <= SENTENCE_CHARS


def test_every_kind_has_a_realistic_sample() -> None:
    assert sorted(set(EventKind) - SAMPLES.keys()) == []


@pytest.mark.parametrize("kind", list(EventKind))
def test_every_kind_reads_as_one_line_without_reprs(kind: EventKind) -> None:
    text = describe(event(kind, **SAMPLES[kind]))
    assert text and one_line(text), text
    assert not set("{}[]'") & set(text), text
    assert "?" not in text, text  # every field the sentence names was found


def test_every_kind_but_unknown_has_its_own_sentence() -> None:
    assert sorted(set(EventKind) - SENTENCES.keys()) == [EventKind.unknown]


def test_goodput_is_summarised_on_one_line_with_rounded_numbers() -> None:
    assert describe(event("goodput", **GOODPUT)) == \
        "goodput 87% over 12.3 s; lost: recovery (start) 5.18 s, checkpoint 0.41 s"


def test_a_root_cause_names_its_error_and_where_it_was_raised() -> None:
    assert describe(event("worker_failed", **SAMPLES[EventKind.worker_failed])) == \
        "rank 3 failed: ValueError: bad batch at train.py:42 in step (exit code 1) — root cause"


def test_a_consequence_names_the_rank_and_node_of_its_root_cause() -> None:
    names = {"gpu-node-018.example.internal": "gpu-node-018…"}
    failed = event("worker_failed", rank=2, round=2, exit_code=1, root_cause=False,
                   consequence_of={"node": "gpu-node-018.example.internal", "rank": 3})
    assert describe(failed, lambda n: names.get(n, n)) == \
        "rank 2 failed (exit code 1), a consequence of rank 3 on node gpu-node-018…"
    killed = event("worker_failed", rank=5, exit_code=None, signal="SIGKILL",
                   error={"traceback": ERROR["traceback"], "source": "output"})
    assert describe(killed) == "rank 5 failed: ValueError: bad batch (signal SIGKILL)"


def test_the_end_of_a_failed_job_names_its_root_cause() -> None:
    assert describe(event("job_end", **SAMPLES[EventKind.job_end])) == (
        "failed: worker rank 3 on node b exited with exit code 1; root cause rank 3 on b: ValueError: bad batch at "
        "train.py:42 in step")


def test_a_hung_rank_names_where_it_is_blocked_or_why_no_stack_was_taken() -> None:
    assert describe(event("worker_hung", **SAMPLES[EventKind.worker_hung])) == \
        "rank 1 made no step for 6.2 s, blocked at train.py:17 in wait_forever"
    assert describe(event("worker_hung", rank=1, silent_s=61.04, stacks_note="py-spy is not installed")) == \
        "rank 1 made no step for 61 s (no stack: py-spy is not installed)"
    assert describe(event("worker_not_left", **SAMPLES[EventKind.worker_not_left])) == \
        "rank 2 did not leave its group within 13 s; replaced, blocked at train.py:40 in step"


def test_fields_read_like_a_person_wrote_them() -> None:
    assert describe(event("checkpoint_saved", **SAMPLES[EventKind.checkpoint_saved])) == \
        "rank 3 saved step 200: 45.8M in 0.0493 s to …/step-000200/rank-00017.pt"
    assert describe(event("round_started", **SAMPLES[EventKind.round_started]), str.upper) == \
        "round 2 of world 4 (failure: rank 3 exited 1); ranks A 0-1, B 2-3"
    assert describe(event("workers_stopped", **SAMPLES[EventKind.workers_stopped])) == \
        "round 1 stopped at step 240: exit code 0 (ranks 0-1), signal SIGTERM (rank 3)"
    assert describe(event("drain_complete", **SAMPLES["drain_complete"])) == \
        "done in 12.3 s; out: b (op 9ae6b97fc3f8495a)"


def test_a_kind_without_a_sentence_lists_its_fields_without_reprs() -> None:
    text = describe(event("from_a_newer_version", ranks=[0, 1], nested={"a": {"b": 1}}, note="x\ny", flag=True))
    assert text == "ranks: 0,1, nested: 1 item, note: x, flag: yes"


HUGE = "x" * 1_000_000


def deep(levels: int) -> dict[str, Any]:
    body: dict[str, Any] = {"leaf": 1}
    for _ in range(levels):
        body = {"nested": body}
    return body


GARBAGE: list[dict[str, Any]] = [
    {},
    dict.fromkeys(("rank", "round", "reason", "error", "stack", "timeline", "totals", "rank_map", "nodes",
                   "exit_codes", "root_cause", "consequence_of", "scheduler", "heal", "args", "op_id"), None),
    dict.fromkeys(("rank", "round", "reason", "error", "stack", "timeline", "totals", "rank_map", "nodes",
                   "exit_codes", "root_cause", "consequence_of", "scheduler", "heal", "args", "op_id", "path",
                   "detail", "where"), HUGE),
    {"rank": [1, 2], "round": {"x": 1}, "nodes": "b", "ranks": "0-3", "timeline": [1, 2], "totals": {"a": "1"},
     "exit_codes": {"x": "y", "9" * 40: 1, 10**400: -(10**400)}, "rank_map": {"a": "0-1", 3: [1, "2"]},
     "error": {"type": ["ValueError"], "message": {"text": "bad"}, "traceback": 7}, "silent_s": float("nan"),
     "bytes": float("inf"), "duration_s": True, "exit_code": 10**400, "consequence_of": {"node": 3, "rank": None},
     "stack": {"where": None, "text": HUGE}, "joining": [None, {}], "root_cause": "yes", "heal": {"seconds": -1}},
    {**deep(500), "error": deep(500), "root_cause": deep(500), HUGE: HUGE, 10**400: "k"},
    {"reason": "\n".join(["Traceback (most recent call last):", *["  frame"] * 10_000, "RuntimeError: " + HUGE])},
]


@pytest.mark.parametrize("body", GARBAGE)
def test_garbage_gives_one_bounded_line(body: dict[str, Any]) -> None:
    for kind, sentence in SENTENCES.items():  # each sentence itself, not only describe's fallback
        assert isinstance(sentence(Body({**body, "kind": kind}, str)), str)
        assert one_line(describe({**body, "kind": kind}))
    for kind in (None, 7, ["goodput"], "unknown", "a" * 1000):
        assert one_line(describe({**body, "kind": kind}))
    assert one_line(describe(None))  # type: ignore[arg-type]


def test_durations_keep_three_significant_digits() -> None:
    assert [significant(v) for v in (0.049312345, 0.8, 12.345, 1234.5, 99.96)] == ["0.0493", "0.800", "12.3", "1234",
                                                                                   "100"]
    assert format_seconds(0.049312345) == "0.0493 s" and format_seconds(None) == "-"


def test_long_paths_keep_the_file_name_and_the_distinguishing_tail() -> None:
    assert short_path(CKPT) == "…/step-000200/rank-00017.pt"
    assert short_path("/ckpt/step-200/rank-3.pt") == "/ckpt/step-200/rank-3.pt"
    assert short_path("/x/" + "a" * 60 + ".pt", 20).endswith("aaa.pt")


def test_a_resize_says_where_its_stall_went_in_parts_that_add_up() -> None:
    line = describe(event(EventKind.resize, **SAMPLES[EventKind.resize]))
    assert ": stall leave 0.30 + group 0.80 + rebuild 0.30 + plan 0.02 + transfer 0.40 + first_step 0.30 + " \
           "other 0.08 = 2.20 s; detect 0.00 → " in line, line
