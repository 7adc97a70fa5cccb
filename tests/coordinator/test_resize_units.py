"""The coordinator's in-place decisions (elasticd/coordinator/resize.py), without daemons: which rounds keep workers."""

from __future__ import annotations

from typing import Any

import pytest
from support.sim import Sim, verb

from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.membership import MemoryStore, NodeRecord, RankEntry, Round
from elasticd.coordinator.resize import Resizer
from elasticd.job.config import LEAVE_SLACK_S, STOP_SLACK_S, JobConfig
from elasticd.job.events import EventLog
from elasticd.wire.heal_report import Heal
from elasticd.wire.member_state import ProgressReport
from elasticd.wire.names import Cause, EventKind, MeshOp

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`


def round_of(round_id: int, nodes: dict[str, list[int]]) -> Round:
    members = [RankEntry(n, i, "127.0.0.1", ranks) for i, (n, ranks) in enumerate(nodes.items())]
    return Round(round_id, members, sum(len(r) for r in nodes.values()), "127.0.0.1", 1, Cause.membership, "", 0.0)


def node(node_id: str, round_id: int, in_place: bool, ranks: list[int]) -> NodeRecord:
    rec = NodeRecord(node_id, "127.0.0.1", len(ranks), "i", 1)
    rec.metrics = {str(r): {"round": round_id, "in_place": in_place} for r in ranks}
    return rec


def resizer() -> tuple[Resizer, list[tuple[str, dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    r = Resizer("job", lambda kind, **fields: events.append((kind, fields)) or {})
    r.job_store_started("127.0.0.1:1", "")
    return r, events


def test_a_round_is_in_place_only_when_every_survivor_resizes_in_place() -> None:
    r, _ = resizer()
    prev = round_of(1, {"a": [0, 1], "b": [2, 3]})
    assert not r.begin(None, [node("a", 1, True, [0, 1])], 1, 0.0, 0.0)  # the first round forks everyone
    assert r.begin(prev, [node("a", 1, True, [0, 1]), node("c", 0, False, [])], 2, 0.0, 0.0)  # c: a newcomer
    rnd = round_of(2, {"a": [0, 1], "c": [2, 3]})
    assert r.fields(rnd) == {"in_place": True, "store": "127.0.0.1:1", "prefix": "elastic/job/g2"}
    assert r.hot_spare(rnd, standby=True) and not r.hot_spare(rnd, standby=False)
    assert not r.begin(prev, [node("a", 1, True, [0, 1]), node("b", 1, False, [2, 3])], 3, 0.0, 0.0)
    r.store = ""
    assert not r.begin(prev, [node("a", 1, True, [0, 1])], 4, 0.0, 0.0)  # no job store (--keys): restart
    assert r.fields(round_of(4, {"a": [0, 1]})) == {"in_place": False}
    assert not r.hot_spare(round_of(4, {"a": [0, 1]}), standby=True)


def test_a_failed_resize_is_an_event_and_the_next_round_restarts() -> None:
    r, events = resizer()
    prev = round_of(1, {"a": [0, 1]})
    assert r.begin(prev, [node("a", 1, True, [0, 1])], 2, 0.0, 0.0)
    assert not r.failed(1, "a stale round's failure")  # only the round in flight can fail
    assert r.failed(2, "rank 1 on node a: RuntimeError: boom")
    assert events == [(EventKind.resize_failed, {"generation": 2, "round": 2,
                                                 "reason": "rank 1 on node a: RuntimeError: boom"})]
    assert not r.begin(round_of(2, {"a": [0, 1]}), [node("a", 2, True, [0, 1])], 3, 0.0, 0.0)
    assert r.begin(round_of(3, {"a": [0, 1]}), [node("a", 3, True, [0, 1])], 4, 0.0, 0.0)  # once only


def test_a_generation_that_never_syncs_falls_back_and_one_that_does_closes_its_timeline() -> None:
    r, events = resizer()
    prev, nxt = round_of(1, {"a": [0, 1]}), round_of(2, {"a": [0, 1]})
    assert r.begin(prev, [node("a", 1, True, [0, 1])], 2, 10.0, 10.0)
    nxt.timeline["go"] = 10.1
    r.progress("a", ProgressReport(2, group_ready=10.2, synced=10.3, in_place=True), nxt)
    r.first_step(nxt, 10.4)
    kind, fields = events[-1]
    assert kind == EventKind.resize and fields["timeline"] == {
        "detect": 0.0, "agreed": 0.0, "left": 0.1, "group_ready": 0.2, "synced": 0.3, "first_step": 0.4}
    assert r.begin(nxt, [node("a", 0, False, [0, 1])], 3, 20.0, 20.0)  # its `synced` said in place
    assert not r.expired(20.0 + 29) and r.expired(20.0 + 31)
    assert events[-1][0] == EventKind.resize_failed and "synced within 30s" in events[-1][1]["reason"]


def test_a_resize_says_where_its_stall_went_in_parts_that_add_up_to_it() -> None:
    r, events = resizer()
    prev, nxt = round_of(1, {"a": [0, 1], "b": [2, 3]}), round_of(2, {"a": [0, 1], "b": [2, 3]})
    assert r.begin(prev, [node("a", 1, True, [0, 1]), node("b", 1, True, [2, 3])], 2, 10.0, 10.0)
    nxt.timeline["go"] = 10.2
    # a's ranks were done first, though one of them moved more: the stall ended with b's last rank.
    r.progress("a", ProgressReport(2, last_step_at=10.05, group_ready=10.3, synced=11.0, rebuild_s=0.3, state_s=0.2,
                                   collect_s=0.04, in_place=True, heal=Heal(received_bytes=1 << 20, seconds=0.45,
                                                                            plan_s=0.05, transfer_s=0.4)), nxt)
    r.progress("b", ProgressReport(2, last_step_at=10.1, group_ready=10.4, synced=11.2, rebuild_s=0.2, state_s=0.1,
                                   wait_s=0.05, collect_s=0.03, restore_s=0.1, in_place=True,
                                   heal=Heal(received_bytes=1 << 10, seconds=0.3, plan_s=0.1, transfer_s=0.2)), nxt)
    r.first_step(nxt, 11.5)
    kind, fields = events[-1]
    assert kind == EventKind.resize
    # From the first rank's leaving its group (a's, at 10.05) to the first step, along b's last rank.
    assert fields["stall_s"] == 1.45
    assert fields["parts"] == {"leave": 0.15, "group": 0.2, "rebuild": 0.2, "state": 0.1, "wait": 0.05,
                               "collect": 0.03, "plan": 0.1, "transfer": 0.2, "restore": 0.1, "first_step": 0.3,
                               "other": 0.02}
    assert sum(fields["parts"].values()) == pytest.approx(fields["stall_s"])
    # What the heal moved, every node's together: bytes summed, the first fallback (none here); its times are
    # those of the rank the stall ended with, as its parts are.
    assert fields["heal"] == {"received_bytes": (1 << 20) + (1 << 10), "sent_bytes": 0, "senders": 0,
                              "seconds": 0.3, "plan_s": 0.1, "transfer_s": 0.2, "fallback": None, "prepared_bytes": 0}


def test_an_in_place_rounds_stop_barrier_outwaits_the_nodes_wait_for_their_kept_workers() -> None:
    """A node keeps waiting up to grace + LEAVE_SLACK_S for its kept workers to leave their group: the barrier must
    not let the next world start before (no global rank in two worlds), while a restart round keeps its limit."""
    cfg = JobConfig(1, 2, 2, "127.0.0.1", 29400, "job", "a", ["train.py"], grace_s=2.0)
    c = Coordinator(cfg, MemoryStore(), lambda *_: None, EventLog(100), lambda _e: None)
    c.resizer.job_store_started("127.0.0.1:1", "")
    prev, nxt = round_of(1, {"a": [0, 1]}), round_of(2, {"a": [0, 1]})
    assert c.tracker.stop_limit(nxt) == 2.0 + STOP_SLACK_S
    assert c.resizer.begin(prev, [node("a", 1, True, [0, 1])], 2, 0.0, 0.0)
    assert c.tracker.stop_limit(nxt) == 2.0 + STOP_SLACK_S + LEAVE_SLACK_S


def in_place_job(nodes: str) -> Sim:
    """Nodes whose shim ranks resize in place, in a job whose store is up: a graceful change is agreed as a resize."""
    sim = Sim(nodes, min_nodes=1, max_nodes=len(nodes))
    sim.configure(shim=True, in_place=True, step_time=0.1)
    sim.coordinator.resizer.job_store_started("127.0.0.1:1", "")
    return sim


def test_a_join_is_agreed_as_a_resize_in_which_every_rank_stays_and_a_drain_is_not() -> None:
    """A join's `resize_workers` says `all_stay`: a sharded rank then keeps its own shards and gathers none
    first; a drain's does not, so that the leaving node's shards with no replica are gathered before it goes."""
    sim = in_place_job("abc")
    sim.start("a", "b")
    sim.formed()
    sim.start("c")
    assert sim.formed(2).node_ids() == ["a", "b", "c"]
    assert [m.body["all_stay"] for m in sim.msgs(MeshOp.resize_workers)] == [True, True]
    mark = sim.mark()
    verb(sim.coordinator, "drain", {"node": "c"})
    assert sim.formed(3).node_ids() == ["a", "b"]
    assert {m.body["all_stay"] for m in sim.msgs(MeshOp.resize_workers, since=mark)} == {False}

