"""Heartbeats carry changes only (elasticd/member/beats.py); the coordinator keeps the last values for its verbs."""

from __future__ import annotations

from typing import Any

import pytest
from support.sim import Sim, verb

from elasticd.member.beats import DELTA_FIELDS, SLOW_REFRESH_S, BeatDiff, PortPool
from elasticd.wire.member_state import Heartbeat
from elasticd.wire.names import MeshOp

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

WORKER = {"pid": 11, "local_rank": 0, "rank": 0, "state": "running", "exit_code": None, "cpu_percent": 5.0,
          "rss": 1000, "uptime_s": 1.0, "log": "/tmp/r0.log", "round": 1}


def state(workers: list[dict[str, Any]], metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"instance": "i", "ports": [1, 2, 3, 4], "workers": workers, "state": "running", "round": 1,
            "assigned": 1, "metrics": metrics or {}}


def carried(body: dict[str, Any]) -> set[str]:
    return {k for k in DELTA_FIELDS if k in body}


def test_a_steady_beat_carries_nothing_that_the_coordinator_holds() -> None:
    beats = BeatDiff()
    first = beats.body(state([WORKER]), 0.0)
    assert carried(first) == set(DELTA_FIELDS)
    assert carried(beats.body(state([WORKER]), 1.0)) == set(DELTA_FIELDS)  # not answered yet: sent again
    beats.ack(first["beat"])
    quiet = beats.body(state([WORKER]), 2.0)
    assert carried(quiet) == set() and quiet["state"] == "running" and quiet["round"] == 1


def test_a_change_travels_at_once_and_cpu_rss_only_at_the_slow_refresh() -> None:
    beats = BeatDiff()
    beats.ack(beats.body(state([WORKER]), 0.0)["beat"])
    busy = {**WORKER, "cpu_percent": 97.0, "rss": 9000, "uptime_s": 4.0}
    assert carried(beats.body(state([busy]), 1.0)) == set()
    exited = {**busy, "state": "exited", "exit_code": 1}
    assert carried(beats.body(state([exited]), 2.0)) == {"workers"}
    assert carried(beats.body(state([exited], {"0": {"step": 5}}), 3.0)) == {"workers", "metrics"}  # unanswered
    beats.ack(beats.beat)
    later = {**exited, "cpu_percent": 50.0}
    steps = {"0": {"step": 5}}
    assert carried(beats.body(state([later], steps), 3.0 + SLOW_REFRESH_S - 0.5)) == set()
    assert carried(beats.body(state([later], steps), 3.0 + SLOW_REFRESH_S)) == {"workers"}


def test_a_new_registration_sends_everything_again() -> None:
    beats = BeatDiff()
    beats.ack(beats.body(state([WORKER]), 0.0)["beat"])
    beats.reset()
    assert carried(beats.body(state([WORKER]), 1.0)) == set(DELTA_FIELDS)


def test_ports_stay_offered_until_a_round_takes_one() -> None:
    pool = PortPool("127.0.0.1")
    offer = pool.current()
    assert len(offer) == 4 and pool.current() == offer
    pool.take(offer[0])
    again = pool.current()
    assert offer[0] not in again and offer[1:] == again[:3] and len(again) == 4


def hb_from(sim: Sim, node_id: str, start: int) -> list[dict[str, Any]]:
    return [m.body for m in sim.sent[start:] if m.op == MeshOp.hb and m.src == node_id]


def test_in_the_sim_steady_heartbeats_carry_nothing_and_the_verbs_show_the_last_values() -> None:
    sim = Sim(4, nproc=2)
    sim.configure(shim=True, step_time=1000.0)  # one step reported, then none for a long while
    sim.start()
    sim.formed()
    sim.run(2.0)
    mark = len(sim.sent)
    sim.run(5.0)
    beats = [b for n in sim.nodes for b in hb_from(sim, n, mark)]
    assert len(beats) >= 16 and not any(carried(b) for b in beats)
    node = sim.coordinator.nodes["n0001"]
    assert len(node.ports) == 4
    metrics = verb(sim.coordinator, "metrics", {})
    assert {str(r) for r in sim.round.node_ids() for r in sim.round.entry(r).ranks} == \
        {str(r["rank"]) for r in metrics["ranks"]}  # every rank's last report is still shown


def test_the_coordinator_keeps_worker_records_a_quiet_beat_leaves_out() -> None:
    sim = Sim(2, nproc=1)
    sim.start()
    sim.formed()
    c, member = sim.coordinator, sim.nodes["n0001"]
    quiet = Heartbeat(member.instance, state="running", round=1, assigned=1)
    full = Heartbeat.decode({**quiet.encode(), "workers": [WORKER], "metrics": {"0": {"step": 3, "round": 1}}})
    c.heartbeat("n0001", full, sim.clock.now)
    c.heartbeat("n0001", quiet, sim.clock.now)
    assert verb(c, "workers", {})["nodes"]["n0001"] == [WORKER]
    assert c.nodes["n0001"].metrics == {"0": {"step": 3, "round": 1}}
    assert c.status(sim.clock.now)["nodes"][1]["node_id"] == "n0001"


def test_a_master_never_runs_out_of_ports() -> None:
    sim = Sim(2, nproc=1, max_nodes=10)
    sim.start()
    sim.formed()
    ports = [sim.round.master_port]
    for i in range(6):  # more rounds with the same master than it offers ports at once
        sim.add(f"x{i}").start()
        sim.formed(sim.round.round_id + 1)
        ports.append(sim.round.master_port)
    assert 0 not in ports and len(set(ports)) == len(ports)


def test_metrics_a_node_updates_in_place_still_travel_when_they_change() -> None:
    """The node keeps one dict per rank and updates it as steps arrive: a beat must not hold that same object."""
    beats = BeatDiff()
    live = {"step": 10, "loss": 0.5}
    beats.ack(beats.body(state([WORKER], {"1": live}), 0.0)["beat"])
    live.update(step=11, loss=0.4)  # the worker channel's on_step does exactly this
    moved = beats.body(state([WORKER], {"1": live}), 1.0)
    assert carried(moved) == {"metrics"} and moved["metrics"]["1"]["step"] == 11
