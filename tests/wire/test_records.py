"""Typed message bodies: each mesh op with a record (coordinator to member, and the typed ones of member to
coordinator) decodes into it once, and any malformed body (a field missing, of the wrong type, out of range, not an
object, inconsistent) is refused with the op and field named."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.malformed import refused, required

from elasticd.wire.assignment import TO_MEMBER, RoundAssignment
from elasticd.wire.member_reports import TO_COORDINATOR
from elasticd.wire.names import MeshOp, WorkerOp
from elasticd.wire.record import Record
from elasticd.wire.worker_reports import IN_ROUND

pytestmark = pytest.mark.quick

# One realistic body per op, as the coordinator sends it (docs/protocol.md §9.2)...
TO_NODE: dict[str, dict[str, Any]] = {
    MeshOp.welcome: {"ok": True, "role": "active", "round": 3, "events_pub": "tcp://10.0.0.1:5001", "via": ""},
    MeshOp.hb: {"seq": 812, "round": 3, "beat": 41},
    MeshOp.unknown: {},
    MeshOp.left: {"reason": "drained by the operator"},
    MeshOp.round: {"round": 3, "state": "running", "group_rank": 1, "group_world_size": 2, "ranks": [2, 3],
                   "world_size": 4, "master_addr": "10.0.0.1", "master_port": 29500, "restart_count": 1,
                   "max_restarts": 3, "store_tunnel": "", "node_restarts": {"failure": 1}, "in_place": True,
                   "store": "10.0.0.1:29400", "prefix": "elastic/job/g3", "prewarm": False},
    MeshOp.go: {"round": 3},
    MeshOp.job_end: {"state": "failed", "reason": "restarts exhausted",
                     "root_cause": {"node": "b", "rank": 3, "exit_code": 1}, "consequences": []},
    MeshOp.probe: {"round": 3},
    MeshOp.step_query: {"op_id": "5f2a"},
    MeshOp.drain_workers: {"request_id": "r1", "at_step": 120},
    MeshOp.checkpoint_workers: {"request_id": "r2", "at_step": None},
    MeshOp.resize_workers: {"request_id": "r3", "at_step": 121},
    MeshOp.kill_worker: {"rank": 2},
    MeshOp.relay: {"via": "tcp://10.0.0.7:6001"},
    MeshOp.node_query: {"id": "q1", "op": "logs", "args": {"node": "b", "rank": 3, "tail": 20}},
}
# ...and as a member sends it (§9.1), for the ops typed so far.
FROM_NODE: dict[str, dict[str, Any]] = {
    MeshOp.announce: {}, MeshOp.warm: {},
    MeshOp.leave: {"reason": "node c's elasticd received SIGTERM", "graceful": True},
    MeshOp.node_done: {"round": 3}, MeshOp.node_drained: {"round": 3}, MeshOp.pong: {"round": 3},
    MeshOp.first_step: {"round": 3, "at": 1795841441.68, "step": 121},
    MeshOp.step_report: {"op_id": "5f2a", "step": 120, "step_time": 0.21, "in_place": True},
    MeshOp.resize_failed: {"round": 4, "reason": "rank 3 on node c: the generation's store did not answer"},
    MeshOp.node_answer: {"id": "q1", "body": {"ok": True, "node": "b", "round": 3, "ranks": []}},
    MeshOp.health: {"checks": ["command", "xid", "log_dir"],
                    "findings": [{"check": "xid", "reason": "GPU 3: XID 79 (the GPU has fallen off the bus)"}]},
}
# ...and as a shim rank sends it to its daemon (docs/worker-channel.md).
FROM_RANK: dict[str, dict[str, Any]] = {
    WorkerOp.step: {"rank": 3, "step": 7, "loss": 2.5, "samples": 32, "tokens": 640, "step_time": 0.21,
                    "metrics": {"lr": 0.1, "collective_wait_s": None}, "dropped": 0},
    WorkerOp.checkpoint: {"rank": 3, "step": 7, "path": "/ck/ckpt-00000007.pt", "bytes": 1234, "duration_s": 0.5,
                          "request_id": "rq"},
    WorkerOp.checkpoint_skipped: {"rank": 3, "path": "/ck/bad.pt", "reason": "sha256 mismatch"},
    WorkerOp.ack: {"rank": 3, "request_id": "rq", "op": "drain"},
    WorkerOp.drained: {"rank": 3, "step": 8, "request_id": "rq"},
}
MESH: dict[str, type[Record]] = {**TO_MEMBER, **TO_COORDINATOR}  # no op is in both directions
# The worker channel's ops share some names with the mesh's (`checkpoint` is a WorkerOp only): keyed apart.
RECORDS: dict[str, type[Record]] = {**MESH, **{f"worker.{op}": r for op, r in IN_ROUND.items()}}
SENT = {**TO_NODE, **FROM_NODE, **{f"worker.{op}": body for op, body in FROM_RANK.items()}}


def test_every_typed_op_has_a_record_and_a_sample() -> None:
    assert not set(TO_MEMBER) & set(TO_COORDINATOR)
    assert set(TO_MEMBER) == set(TO_NODE) and set(TO_COORDINATOR) == set(FROM_NODE) and set(IN_ROUND) == set(FROM_RANK)


@pytest.mark.parametrize("op", sorted(SENT))
def test_a_sent_body_decodes_and_encodes_back_as_sent(op: str) -> None:
    record = RECORDS[op].decode(json.loads(json.dumps(SENT[op])), op)
    encoded = record.encode()
    assert {k: v for k, v in encoded.items() if k in SENT[op]} == SENT[op]
    assert RECORDS[op].decode(encoded, op) == record  # what the coordinator encodes, a member decodes alike


@pytest.mark.parametrize("op", sorted(SENT))
def test_a_field_of_a_newer_coordinator_is_ignored(op: str) -> None:
    assert RECORDS[op].decode({**SENT[op], "from_the_future": [1]}, op) == RECORDS[op].decode(SENT[op], op)


def refusal(op: str, body: object) -> str:
    return refused(RECORDS[op], op, body)


@pytest.mark.parametrize("op", sorted(SENT))
def test_each_kind_of_malformed_body_is_refused_with_the_field_named(op: str) -> None:
    assert "must be an object" in refusal(op, [SENT[op]])
    assert "must be an object" in refusal(op, None)
    for name in required(RECORDS[op]):
        assert f"'{name}' is missing" in refusal(op, {k: v for k, v in SENT[op].items() if k != name})
    for name, value in SENT[op].items():
        wrong: Any = {} if not isinstance(value, dict) else "text"
        assert f"'{name}" in refusal(op, {**SENT[op], name: wrong})


def test_numbers_out_of_range_and_inconsistent_rounds_are_refused() -> None:
    body = SENT[MeshOp.round]
    assert "'ranks[1]' is out of range" in refusal(MeshOp.round, {**body, "ranks": [2, 2**70]})
    assert "'ranks[0]' must be int, got bool" in refusal(MeshOp.round, {**body, "ranks": [True]})
    assert "world_size 0" in refusal(MeshOp.round, {k: v for k, v in body.items() if k != "world_size"})
    assert "'state' must be str, got null" in refusal(MeshOp.round, {**body, "state": None})
    assert "'node_restarts.failure' must be int" in refusal(MeshOp.round, {**body, "node_restarts": {"failure": "1"}})


def test_a_round_without_an_id_says_why_the_node_waits() -> None:
    waiting = RoundAssignment.decode({"round": None, "state": "standby", "reason": "at its target size"})
    assert (waiting.round, waiting.state, waiting.reason, waiting.master_port) == (None, "standby",
                                                                                   "at its target size", 0)
    assert RoundAssignment.decode({"round": None}).state == "waiting"
