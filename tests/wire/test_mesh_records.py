"""What a member tells the coordinator of itself (wire/member_state.py): `register`, `hb`, `event`, `worker_failed`
and `round_progress` decode what the real senders send, refuse a malformed body with the op and the field named,
and a malformed one reaches the coordinator as a warning, never as an exception or a change."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest
from support.malformed import refused, required
from support.sim import Sim

from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.inbox import RECORDS
from elasticd.coordinator.membership import MemoryStore
from elasticd.job.config import JobConfig
from elasticd.job.events import EventLog
from elasticd.job.slurm import SlurmStep
from elasticd.member.agent import NodeAgent, event_body
from elasticd.wire.assignment import Fenced, Welcome
from elasticd.wire.diagnosis import ErrorInfo, Failure
from elasticd.wire.heal_report import Heal
from elasticd.wire.member_reports import TO_COORDINATOR
from elasticd.wire.member_state import STATE_REPORTS, EventReport, Heartbeat, ProgressReport, Register, WorkerFailed
from elasticd.wire.names import EventKind, MeshOp
from elasticd.wire.protocol import MAX_FRAME_BYTES, Envelope, ErrorCode, ProtocolError, decode, encode
from elasticd.wire.record import Record, field_names
from elasticd.wire.worker_reports import RankStep, Saved

pytestmark = pytest.mark.quick

NOW = 1795841441.5
WORKER = {"pid": 4242, "local_rank": 1, "rank": 3, "state": "running", "exit_code": None, "cpu_percent": 97.5,
          "rss": 2_147_483_648, "uptime_s": 812.4, "log": "/logs/job/r3.log", "round": 3,
          "gpu": {"index": 1, "util_percent": 93, "mem_used_bytes": 70_000_000_000, "mem_total_bytes": 85_899_345_920,
                  "temp_c": 61, "power_w": 402.3, "proc_mem_bytes": 68_000_000_000}}


def agent() -> NodeAgent:
    """A node agent as its daemon sets it up: endpoints bound, a SLURM step, ranks that reported."""
    step = SlurmStep("81234", "0", ("gpu-a", "gpu-b"), "gpu-b", 8, 64, 2)
    cfg = JobConfig(1, 4, 2, "10.0.0.1", 29400, "job", "gpu-b", ["train.py"], node_rank=1,
                    scheduler={**step.public(), "keys": "/keys", "keys_owner": False})
    node = NodeAgent(cfg, "10.0.0.2", lambda _op, _body: None, lambda _kind, **_fields: None, {})
    node.bound({"control": "tcp://10.0.0.2:5100", "pub": "tcp://10.0.0.2:5101", "store_tunnel": "tcp://10.0.0.2:5102",
                "relay": "tcp://10.0.0.2:5103"}, {})
    node.round_id = node.latest_round = 3
    node.rank_reports.hello(2, 3, NOW - 60, in_place=True)
    node.rank_reports.step(RankStep(2, 120, loss=2.5, samples=32, tokens=4096, step_time=0.21,
                                    metrics={"lr": 0.001, "collective_wait_s": None}), NOW)
    node.rank_reports.checkpoint(Saved(2, 100, "/ck/ckpt-00000100.pt", 1234, 0.5, "rq"), NOW - 5)
    node.rank_reports.hello(3, 3, NOW - 60, in_place=True)
    return node


def sent() -> dict[str, dict[str, Any]]:
    """One body per op, as its sender builds it (member/agent.py, member/in_place.py, daemon/daemon.py, link.py)."""
    node = agent()
    beat = {**node.heartbeat_body(NOW), "workers": [WORKER], "via": "tcp://10.0.0.7:6001", "via_failed": ""}
    failure = Failure("gpu-b", 3, 3, exit_code=1, pid=4242, at=NOW, reason="worker rank 3 on node gpu-b exited "
                      "with exit code 1", log="/logs/job/r3.log",
                      error=ErrorInfo("ValueError", "bad batch 7", "train.py:42 in step", "/job/train.py", 42,
                                      "Traceback ...", "output"))
    stopped = ProgressReport(3, stopped=NOW, events=[event_body(EventKind.workers_stopped, round=2,
                                                                exit_codes={"0": -15, "1": -15}, last_step=119)])
    joined = ProgressReport(3, in_place=True, group_ready=NOW, synced=NOW + 0.2,
                            heal=Heal.merged([Heal(received_bytes=10, seconds=0.5), Heal(senders=1)]))
    bodies = {
        MeshOp.register: node.register_body(),
        MeshOp.hb: beat,
        MeshOp.event: event_body(EventKind.worker_exited, round=3, rank=3, pid=4242, exit_code=-9).encode(),
        MeshOp.worker_failed: {**failure.body(), "detected": NOW},
        MeshOp.round_progress: stopped.encode(),
        "round_progress.in_place": joined.encode(),
    }
    return json.loads(json.dumps(bodies))  # as the mesh delivers them


SENT = sent()
OPS = sorted(SENT)


def record_of(op: str) -> type[Record]:
    return STATE_REPORTS[op.split(".")[0]]


def refusal(op: str, body: object) -> str:
    return refused(record_of(op), op.split(".")[0], body)


def test_every_op_a_member_sends_has_a_record_and_the_coordinator_decodes_each() -> None:
    assert not set(STATE_REPORTS) & set(TO_COORDINATOR) and RECORDS == {**TO_COORDINATOR, **STATE_REPORTS}
    c = Coordinator(JobConfig(1, 2, 1, "127.0.0.1", 1, "job", "a", ["t.py"]), MemoryStore(), lambda *_: None,
                    EventLog(), lambda _e: None)
    assert set(c.handlers) <= set(RECORDS)  # no op reaches its handler as a raw body
    assert {op.split(".")[0] for op in OPS} == set(STATE_REPORTS)


@pytest.mark.parametrize("op", OPS)
def test_a_sent_body_decodes_and_encodes_back_as_it_decodes(op: str) -> None:
    record = record_of(op).decode(SENT[op], op)
    assert record_of(op).decode(json.loads(json.dumps(record.encode())), op) == record


@pytest.mark.parametrize("op", [op for op in OPS if op != MeshOp.event])  # an event's own fields are what it carries
def test_a_field_of_a_newer_member_is_ignored(op: str) -> None:
    assert record_of(op).decode({**SENT[op], "from_the_future": [1]}, op) == record_of(op).decode(SENT[op], op)


def test_the_senders_bodies_read_as_they_were_meant() -> None:
    reg = Register.decode(SENT[MeshOp.register])
    assert (reg.host, reg.nproc, reg.node_rank, reg.relay) == ("10.0.0.2", 2, 1, "tcp://10.0.0.2:5103")
    assert len(reg.ports) == 4 and reg.store_tunnel == "tcp://10.0.0.2:5102"
    assert reg.scheduler is not None and reg.scheduler.encode() == {"kind": "slurm", "job_id": "81234", "step_id": "0",
                                                                    "restart_count": 2}
    beat = Heartbeat.decode(SENT[MeshOp.hb])
    assert (beat.instance, beat.round, beat.assigned, beat.via) == (reg.instance, 3, 3, "tcp://10.0.0.7:6001")
    assert beat.metrics is not None and beat.metrics["2"]["step"] == 120 and beat.metrics["3"]["in_place"] is True
    assert beat.metrics["2"]["extra"] == {"lr": 0.001, "collective_wait_s": None}
    assert beat.workers == [WORKER]  # worker records are kept as sent
    progress = ProgressReport.decode(SENT[MeshOp.round_progress])
    assert progress.spawned is None and progress.events[0].kind == EventKind.workers_stopped
    assert progress.events[0].fields == {"round": 2, "exit_codes": {"0": -15, "1": -15}, "last_step": 119}
    healed = ProgressReport.decode(SENT["round_progress.in_place"])
    assert healed.heal is not None and healed.heal.received_bytes == 10 and healed.synced == NOW + 0.2


def test_a_heartbeat_leaves_out_what_the_coordinator_holds() -> None:
    quiet = Heartbeat.decode({"instance": "i", "beat": 2, "state": "running", "round": 3, "assigned": 3})
    assert (quiet.ports, quiet.workers, quiet.metrics, quiet.via) == (None, None, None, None)  # None: keep its own
    assert Heartbeat.decode({"instance": "i", "ports": None}).ports is None


def test_an_event_is_flat_and_the_job_log_numbers_it() -> None:
    event = EventReport.decode({"kind": "checkpoint_saved", "ts": 5, "node": "x", "seq": 9, "rank": 1, "step": 7})
    assert (event.kind, event.ts, event.fields) == ("checkpoint_saved", 5.0, {"rank": 1, "step": 7})
    assert event.encode() == {"kind": "checkpoint_saved", "ts": 5.0, "rank": 1, "step": 7}
    assert EventReport.decode({}).kind == EventKind.unknown


def test_a_progress_report_leaves_out_the_phases_it_is_not_about() -> None:
    assert ProgressReport(4, spawned=NOW).encode() == {"round": 4, "spawned": NOW, "in_place": False, "events": []}


def test_a_reported_failure_is_clipped_and_dated_as_the_failure_events_carry_it() -> None:
    report = WorkerFailed.decode({**SENT[MeshOp.worker_failed], "signal": "S" * 100, "reason": "r" * 5000,
                                  "detected": 0.0})
    failure = report.failure("gpu-b")
    assert (failure.node, len(failure.signal), len(failure.reason), failure.at) == ("gpu-b", 20, 1000, NOW)
    assert failure.error is not None and failure.error.where == "train.py:42 in step"
    assert Failure.from_body("gpu-b", SENT[MeshOp.worker_failed]) == WorkerFailed.decode(
        SENT[MeshOp.worker_failed]).failure("gpu-b")  # the lenient reading of `status` agrees


@pytest.mark.parametrize("op", OPS)
def test_each_kind_of_malformed_body_is_refused_with_the_field_named(op: str) -> None:
    name = op.split(".")[0]
    assert "body must be an object, got list" in refusal(op, [SENT[op]])
    assert "body must be an object, got null" in refusal(op, None)
    for field in required(record_of(op)):
        assert f"{name}: field '{field}' is missing" == refusal(op, {k: v for k, v in SENT[op].items() if k != field})
    declared = set(field_names(record_of(op)))
    for field, value in SENT[op].items():
        if field in declared:
            wrong: Any = {} if not isinstance(value, dict) else "text"
            assert refusal(op, {**SENT[op], field: wrong}).startswith(f"{name}: field '{field}")


@pytest.mark.parametrize(("op", "field"), [(MeshOp.register, "nproc"), (MeshOp.hb, "beat"),
                                           (MeshOp.worker_failed, "pid"), (MeshOp.round_progress, "round")])
def test_a_number_past_the_wire_s_range_is_refused_with_its_field(op: str, field: str) -> None:
    assert refusal(op, {**SENT[op], field: 2**70}) == f"{op}: field '{field}' is out of range"


@pytest.mark.parametrize(("op", "change", "why"), [
    (MeshOp.hb, {"metrics": {"2": {"rank": 2, "step": "120"}}}, "hb: field 'metrics.2.step' must be int, got str"),
    (MeshOp.hb, {"metrics": {"2": {"extra": {"lr": "high"}}}}, "hb: field 'metrics.2.extra.lr' must be float, got str"),
    (MeshOp.hb, {"metrics": {"2": {"round": 2**70}}}, "hb: field 'metrics.2.round' is out of range"),
    (MeshOp.hb, {"metrics": {"2": {"last_checkpoint": {"at": "now"}}}},
     "hb: field 'metrics.2.last_checkpoint.at' must be float, got str"),
    (MeshOp.hb, {"workers": [{**WORKER, "pid": True}]}, "hb: field 'workers[0].pid' must be int, got bool"),
    (MeshOp.hb, {"workers": [{**WORKER, "gpu": {"index": None}}]}, "hb: field 'workers[0].gpu.index' must be int"),
    (MeshOp.hb, {"ports": [29500, "29501"]}, "hb: field 'ports[1]' must be int, got str"),
    (MeshOp.register, {"scheduler": {"restart_count": "2"}}, "register: field 'scheduler.restart_count' must be int"),
    (MeshOp.worker_failed, {"error": {"message": "no type"}}, "worker_failed: field 'error.type' is missing"),
    (MeshOp.round_progress, {"events": [{"kind": "x", "ts": "late"}]},
     "round_progress: field 'events[0].ts' must be float, got str"),
    (MeshOp.round_progress, {"heal": {"seconds": None}},
     "round_progress: field 'heal.seconds' must be float, got null"),
])
def test_a_nested_field_is_refused_by_its_path(op: str, change: dict[str, Any], why: str) -> None:
    assert refusal(op, {**SENT[op], **change}).startswith(why)


def test_the_epoch_of_a_fenced_message_is_an_int() -> None:
    assert Fenced.decode({"round": 3, "epoch": 7}).epoch == 7 and Fenced.decode({}).epoch == 0
    with pytest.raises(ProtocolError, match="field 'epoch' must be int, got str"):
        Fenced.decode({"epoch": "7"})


def test_a_welcome_says_only_what_it_is() -> None:
    assert Welcome(True, "standby", 3, "tcp://c:1").encode() == {"ok": True, "role": "standby", "round": 3,
                                                                 "events_pub": "tcp://c:1", "prewarm": False,
                                                                 "expected_world": 0, "via": ""}
    warm = Welcome(True, "active", 3, "tcp://c:1", True, 5, store="10.0.0.1:29400", prefix="elastic/j")
    assert warm.encode() == {"ok": True, "role": "active", "round": 3, "events_pub": "tcp://c:1", "prewarm": True,
                             "expected_world": 5, "via": "", "store": "10.0.0.1:29400", "prefix": "elastic/j"}
    assert Welcome.decode(warm.encode()) == warm
    refused = Welcome.refusal(ProtocolError(ErrorCode.DUPLICATE_NODE, "taken"))
    assert refused.encode() == {"ok": False, "errno": ErrorCode.DUPLICATE_NODE, "code": "duplicate_node",
                                "reason": "taken"}


# ---- the coordinator: a malformed frame is a warning ---------------------------------------------------------
@pytest.mark.parametrize(("op", "body"), [
    (MeshOp.hb, {"instance": "?", "metrics": {"0": {"step": "many"}}}),
    (MeshOp.hb, {"instance": "?", "beat": 2**70}),
    (MeshOp.register, {"instance": "i-z", "host": "z", "nproc": "8"}),
    (MeshOp.register, ["instance", "host"]),
    (MeshOp.round_progress, {"round": 1, "stopped": "now"}),
    (MeshOp.round_progress, {"stopped": 1.0}),
    (MeshOp.worker_failed, {"round": 1, "rank": "3"}),
    (MeshOp.event, {"kind": 7}),
])
def test_a_malformed_frame_is_dropped_with_a_warning_and_changes_nothing(op: str, body: object,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    sim = Sim("ab", min_nodes=2)
    sim.start()
    sim.formed()
    c, b = sim.coordinator, sim.nodes["b"]
    if op == MeshOp.hb and isinstance(body, dict):
        body = {**body, "instance": b.instance}
    before = (c.events.seq, len(sim.sent), {n.node_id: (n.status, n.metrics, n.last_seen) for n in c.nodes.values()})
    now = sim.clock.now
    with caplog.at_level(logging.WARNING, logger="elasticd"):
        sender = "z" if op == MeshOp.register else "b"
        c.receive(sender, Envelope("req", op, body, node=sender), now)  # type: ignore[arg-type]
    assert [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()] != []
    after = (c.events.seq, len(sim.sent), {n.node_id: (n.status, n.metrics, n.last_seen) for n in c.nodes.values()})
    assert after[:2] == before[:2] and set(after[2]) == set(before[2])  # no event, no answer, no node
    assert all(after[2][n][:2] == before[2][n][:2] for n in before[2])
    assert c.nodes["b"].last_seen == max(before[2]["b"][2], now) or op == MeshOp.register  # still a sign of life


def test_a_malformed_heartbeat_off_the_wire_is_refused_naming_the_rank_s_field() -> None:
    beat = {**SENT[MeshOp.hb], "metrics": {"3": {"rank": 3, "loss": "nan?"}}}
    env = decode(encode(Envelope("req", MeshOp.hb, beat, node="gpu-b", ts=time.time())), MAX_FRAME_BYTES)
    with pytest.raises(ProtocolError, match=r"^hb: field 'metrics\.3\.loss' must be float, got str$"):
        Heartbeat.decode(env.body, env.op)


def test_text_in_a_heartbeats_worker_record_is_held_to_the_same_cap_as_a_records_field() -> None:
    worker = {"pid": 7, "rank": 0, "state": "running", "log": "/logs/r0.log"}
    assert Heartbeat.decode({"instance": "i", "workers": [worker]}, "hb").workers == [worker]
    with pytest.raises(ProtocolError, match=r"hb: field 'workers\[0\].log' holds 70000 characters, more than 65536"):
        Heartbeat.decode({"instance": "i", "workers": [{**worker, "log": "x" * 70_000}]}, "hb")
