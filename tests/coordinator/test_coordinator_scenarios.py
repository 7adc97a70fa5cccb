"""Coordinator scenarios on a fake clock and an in-memory mesh: what an operator would see, in milliseconds."""

from __future__ import annotations

import itertools

import pytest
from support.sim import COORD, Sim, verb

from elasticd.commands.registry import REGISTRY
from elasticd.coordinator.coordinator import SETTLE_S
from elasticd.coordinator.core import PendingRound
from elasticd.coordinator.liveness import RECONNECT_GRACE_S
from elasticd.coordinator.resize import RESIZE_TIMEOUT_S, InPlaceRound
from elasticd.coordinator.step_agreement import QUERY_TIMEOUT_S
from elasticd.coordinator.transitions import DRAIN_TIMEOUT_S, SIGNAL_WINDOW_S
from elasticd.daemon.daemon import TICK_S
from elasticd.job.config import STOP_SLACK_S
from elasticd.wire.assignment import RoundAssignment
from elasticd.wire.member_state import ProgressReport, Register
from elasticd.wire.names import Cause, EventKind, JobState, MeshOp, NodeState, Role
from elasticd.wire.protocol import ErrorCode, ProtocolError

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

K = EventKind
MARGIN = 3  # docs: at_step = max + 1 + ceil(150 ms / step time); 0.1 s steps -> 3


FRAMES_PER_NODE = 8  # see test_a_round_costs_the_coordinator_a_constant_number_of_frames_per_node


def restarts(sim: Sim) -> dict[str, int]:
    return {str(k): v for k, v in sim.coordinator.restarts.items()}


def assert_stop_barrier(sim: Sim, round_id: int) -> None:
    """No member got `go` for `round_id` before every member of the round before it reported its workers stopped."""
    previous = next(r for r in sim.rounds() if r.round_id == round_id - 1)
    go = sim.msgs(MeshOp.go)
    first_go = min(m.order for m in go if m.body["round"] == round_id)
    stopped = {m.src: m.order for m in sim.msgs(MeshOp.round_progress)
               if m.body["round"] == round_id and "stopped" in m.body}
    alive = [n for n in previous.node_ids() if sim.coordinator.nodes[n].status == "alive"]
    assert set(alive) <= set(stopped), f"go for round {round_id} without a stop report from {set(alive) - set(stopped)}"
    assert all(stopped[n] < first_go for n in alive)


def test_formation_one_round_world_is_the_sum_and_the_coordinator_holds_rank_0() -> None:
    sim = Sim("abc", min_nodes=1)  # min 1: only the settle window keeps b from starting a world of its own
    for node_id, nproc in zip("abc", (1, 2, 3), strict=True):
        sim.nodes[node_id].nproc = nproc
    sim.start("b", "c", "a", spacing=0.03)  # 30 ms apart, inside the 0.1 s settle window; the coordinator last
    sim.formed()
    sim.run(5.0)  # heartbeats only: nothing more may happen
    assert sim.kinds(K.node_joined, K.round_started) == [K.node_joined] * 3 + [K.round_started]
    assert sim.round.world_size == 6 and sim.round.cause == Cause.start
    assert sim.rank_map() == [("a", [0]), ("b", [1, 2]), ("c", [3, 4, 5])]
    for node_id in "abc":  # each member: its assignment, then `go`, then its workers
        assignment, = sim.msgs(MeshOp.round, dst=node_id)
        go, = sim.msgs(MeshOp.go, dst=node_id)
        spawned = [m for m in sim.msgs(MeshOp.round_progress, src=node_id) if "spawned" in m.body]
        assert assignment.order < go.order < spawned[0].order
        assert sim.nodes[node_id].state == NodeState.running
    assert restarts(sim) == {"failure": 0, "membership": 0, "operator": 0, "hang": 0}


def test_join_appends_the_newcomer_keeps_survivor_order_and_counts_membership() -> None:
    sim = Sim("abc", min_nodes=1, max_nodes=4)
    for node_id, stop_s in zip("abc", (0.2, 0.9, 0.5), strict=True):  # old workers take a while to stop; b is slowest
        sim.nodes[node_id].stop_s = stop_s
    sim.add("d")
    sim.start("b", "c", "a")  # joined in the order b, c, a: rank order must not follow it
    sim.formed()
    sim.run(2.0)
    before, mark = restarts(sim), sim.mark()
    sim.start("d")
    sim.formed(2)
    sim.run(5.0)
    assert sim.kinds(K.node_joined, K.reform_started, K.step_agreed, K.reform_complete, K.round_started,
                     since=mark) == [K.node_joined, K.reform_started, K.step_agreed, K.reform_complete,
                                     K.round_started]
    assert sim.rank_map() == [("a", [0, 1]), ("b", [2, 3]), ("c", [4, 5]), ("d", [6, 7])]
    assert sim.round.world_size == 8 and sim.round.cause == Cause.membership
    assert restarts(sim) == {**before, "membership": before["membership"] + 1}
    assert_stop_barrier(sim, 2)


def test_worker_crash_is_probed_then_charged_once_and_its_echoes_are_ignored() -> None:
    sim = Sim("abc", max_restarts=3)
    sim.start()
    sim.formed()
    mark = sim.mark()
    for node_id in "bca":  # b's worker crashed; its peers' collectives fail right after (echoes)
        sim.nodes[node_id].fail_worker()
    sim.formed(2)
    sim.run(5.0)
    assert sorted(m.dst for m in sim.msgs(MeshOp.probe, since=mark)) == ["c"]  # not b (reporter), not a (here)
    assert sim.kinds(K.round_started, since=mark) == [K.round_started]
    assert sim.round.cause == Cause.failure
    assert restarts(sim) == {"failure": 1, "membership": 0, "operator": 0, "hang": 0}
    assert sim.rank_map() == [("a", [0, 1]), ("b", [2, 3]), ("c", [4, 5])]
    assert {m.body["restart_count"] for m in sim.msgs(MeshOp.round, since=mark)} == {1}  # TORCHELASTIC_RESTART_COUNT
    assert sim.coordinator.nodes["b"].restarts[Cause.failure] == 1
    assert_stop_barrier(sim, 2)


def test_crash_past_max_restarts_ends_the_job_failed_on_every_node() -> None:
    sim = Sim("abc", max_restarts=1)
    sim.start()
    sim.formed()
    sim.nodes["b"].fail_worker()
    sim.formed(2)
    sim.nodes["c"].fail_worker()
    sim.run(2.0)
    assert sim.coordinator.state == JobState.failed
    assert sim.kinds(K.round_started, K.job_end) == [K.round_started, K.round_started, K.job_end]
    assert restarts(sim)["failure"] == 1
    for node in sim.nodes.values():
        assert node.ended is not None and node.ended[0] == JobState.failed
        assert "--max-restarts 1 exhausted" in node.ended[1]


def test_node_loss_after_missed_heartbeats_reforms_without_it_uncharged() -> None:
    sim = Sim("abc", min_nodes=2)
    sim.start()
    sim.formed()
    sim.run(2.3)
    mark = sim.mark()
    sim.nodes["c"].freeze()  # frozen (or cut off): its connection stays open, only its heartbeats stop
    sim.formed(2)
    last_hb = sim.msgs(MeshOp.hb, src="c")[-1].at
    lost, = sim.of(K.node_lost)
    assert lost["node"] == "c" and lost["reason"] == "node c missed 3 heartbeats"
    assert sim.cfg.lost_after_s < lost["at"] - last_hb <= sim.cfg.lost_after_s + sim.tick_s + sim.delay
    assert sim.kinds(K.node_lost, K.reform_started, K.round_started, since=mark) == [K.node_lost, K.round_started]
    assert sim.rank_map() == [("a", [0, 1]), ("b", [2, 3])]
    assert sim.round.cause == Cause.membership
    assert restarts(sim) == {"failure": 0, "membership": 1, "operator": 0, "hang": 0}
    assert_stop_barrier(sim, 2)


def test_a_slow_node_whose_heartbeats_resume_in_time_is_never_lost() -> None:
    sim = Sim("abc", min_nodes=2)
    sim.start()
    sim.formed()
    beats = len(sim.msgs(MeshOp.hb, src="c"))
    sim.run_until(lambda: len(sim.msgs(MeshOp.hb, src="c")) > beats)
    sim.nodes["c"].freeze()  # right after a heartbeat: silent for 2.6 s of the 3 s allowed
    sim.run(2.6)
    sim.nodes["c"].thaw()
    sim.run(10.0)
    times = [m.at for m in sim.msgs(MeshOp.hb, src="c")]
    assert max(b - a for a, b in itertools.pairwise(times)) > 2.5  # it really was silent that long
    assert sim.of(K.node_lost) == [] and sim.msgs(MeshOp.unknown) == []
    assert len(sim.rounds()) == 1 and sim.coordinator.nodes["c"].status == "alive"


def test_sigkilled_node_is_lost_when_its_connection_closes_not_after_heartbeats() -> None:
    sim = Sim("abc", min_nodes=2)
    sim.start()
    sim.formed()
    sim.run(2.3)
    mark, killed = sim.mark(), sim.clock.now
    sim.nodes["c"].kill()
    sim.formed(2)
    lost, = sim.of(K.node_lost)
    assert lost["node"] == "c" and lost["reason"] == "node c's connection closed"
    assert RECONNECT_GRACE_S <= lost["at"] - killed < sim.cfg.lost_after_s  # the grace, not the heartbeat rule
    assert sim.kinds(K.node_lost, K.round_started, since=mark) == [K.node_lost, K.round_started]
    assert sim.rank_map() == [("a", [0, 1]), ("b", [2, 3])] and sim.round.cause == Cause.membership
    assert restarts(sim) == {"failure": 0, "membership": 1, "operator": 0, "hang": 0}
    assert_stop_barrier(sim, 2)


@pytest.mark.parametrize(("down_s", "lost"), [(0.2, False), (RECONNECT_GRACE_S + 0.3, True)])
def test_a_closed_connection_back_within_the_grace_costs_nothing_else_the_node_is_lost(down_s: float,
                                                                                     lost: bool) -> None:
    sim = Sim("abc", min_nodes=2)
    sim.start()
    sim.formed()
    sim.run(1.5)
    sim.nodes["c"].blip(down_s)  # a reset link; the DEALER reconnects after down_s
    sim.run(10.0)
    assert [e["reason"] for e in sim.of(K.node_lost)] == (["node c's connection closed"] if lost else [])
    assert len(sim.rounds()) == (1 if not lost else 3)  # lost: a round without c, then one with it again
    assert sim.coordinator.liveness.closed == {} and sim.coordinator.nodes["c"].status == "alive"


@pytest.mark.parametrize("first", ["closed", "failure"])
def test_failure_reported_while_a_peers_connection_is_closed_loses_it_at_once_uncharged(first: str) -> None:
    """Survivors' collectives break the moment a node dies: that round is failing, so no reconnect grace."""
    sim = Sim("abc", min_nodes=2, max_restarts=3)
    sim.start()
    sim.formed()
    sim.run(1.5)
    mark = sim.mark()
    if first == "closed":
        sim.nodes["c"].kill()
        sim.run(0.1)  # b's collective with c breaks; its worker exits non-zero inside c's reconnect grace
        sim.nodes["b"].fail_worker()
    else:  # the failure report reaches the coordinator just before c's closed connection does
        sim.nodes["b"].fail_worker()
        sim.nodes["c"].kill()
    sim.formed(2)
    sim.run(5.0)
    reported, = sim.msgs(MeshOp.worker_failed, since=mark)
    lost, = sim.of(K.node_lost, since=mark)
    assert lost["reason"] == "node c's connection closed" and lost["at"] - reported.at < RECONNECT_GRACE_S
    assert [m.dst for m in sim.msgs(MeshOp.probe, since=mark)] == ["c"]
    assert sim.msgs(MeshOp.pong, since=mark) == []
    assert sim.kinds(K.node_lost, K.round_started, since=mark) == [K.node_lost, K.round_started]
    assert sim.round.cause == Cause.membership and sim.rank_map() == [("a", [0, 1]), ("b", [2, 3])]
    assert restarts(sim) == {"failure": 0, "membership": 1, "operator": 0, "hang": 0}


def test_a_round_broken_by_lost_nodes_reforms_without_the_settle_window_and_once_for_two_at_once() -> None:
    """Its survivors already wait: the round starts within a tick of the losses, not SETTLE_S later, and two
    daemons one cause ends 5 ms apart still cost one round."""
    sim = Sim("abcd", min_nodes=2, max_restarts=3)
    sim.start()
    sim.formed()
    sim.run(1.5)
    mark = sim.mark()
    sim.nodes["c"].kill()
    sim.run(0.005)
    sim.nodes["d"].kill()
    sim.nodes["b"].fail_worker()  # its collective with c and d broke
    sim.formed(2)
    lost = sim.of(K.node_lost, since=mark)
    started, = sim.of(K.round_started, since=mark)
    assert sorted(e["node"] for e in lost) == ["c", "d"] and sim.rank_map() == [("a", [0, 1]), ("b", [2, 3])]
    assert started["at"] - max(e["at"] for e in lost) < SETTLE_S  # 0.1-0.15 s before: the window, then a tick


def test_the_daemons_loop_wakes_for_a_broken_rounds_window_and_never_spins_on_a_held_round() -> None:
    """It ticks every 50 ms, sooner only to a round's due: a round past due is held (a joiner's warm-up, up to
    30 s), and waking every millisecond for it would burn the coordinator's CPU the whole time."""
    pending = PendingRound(Cause.membership, "node c's connection closed", 10.0, due=10.02)
    assert pending.wake_in(10.0, TICK_S) == pytest.approx(0.02)
    assert pending.wake_in(9.0, TICK_S) == TICK_S
    assert pending.wake_in(10.5, TICK_S) == TICK_S


def shim_job(ids: str = "abc", **kw: object) -> Sim:
    """Shim workers stepping every 0.1 s, formed and running a while; c reports 2 steps ahead (report lag)."""
    sim = Sim(ids, min_nodes=2, **kw)  # type: ignore[arg-type]
    sim.configure(shim=True, step_time=0.1, save_s=0.2)
    for i, node in enumerate(sim.nodes.values()):
        node.step0 = 100 + 2 * (i == 2)
    sim.start()
    sim.formed()
    sim.run(2.0)
    return sim


def test_drain_stops_every_rank_at_one_agreed_step_then_reforms_without_the_node() -> None:
    sim = shim_job()
    c = sim.coordinator
    mark = sim.mark()
    dry = verb(c, "drain", {"node": "c", "dry_run": True})
    assert dry["dry_run"] is True
    assert (dry["plan"]["world_after"], dry["plan"]["ranks_leaving"]) == (4, [4, 5])
    assert sim.events[-1]["order"] < mark and sim.sent[-1].order < mark  # nothing happened
    assert c.transition is None and c.nodes["c"].role == Role.active and c.target == 3
    reply = verb(c, "drain", {"node": "c"})
    assert reply["accepted"] is True
    sim.formed(2)
    agreed, = sim.of(K.step_agreed, since=mark)
    reported = [m.body["step"] for m in sim.msgs(MeshOp.step_report, since=mark)]
    assert len(reported) == 3 and agreed["at_step"] == max(reported) + MARGIN
    drains = sim.msgs(MeshOp.drain_workers, since=mark)
    assert sorted(m.dst for m in drains) == ["a", "b", "c"] and {m.body["at_step"] for m in drains} == {
        agreed["at_step"]}
    drained = sim.msgs(MeshOp.node_drained, since=mark)
    complete, = sim.of(K.drain_complete)
    assert sorted(m.src for m in drained) == ["a", "b", "c"]
    assert complete["order"] > max(m.order for m in drained) and complete["timed_out"] is False
    assert sim.kinds(K.drain_started, K.step_agreed, K.drain_complete, K.round_started, since=mark) == [
        K.drain_started, K.step_agreed, K.drain_complete, K.round_started]
    assert sim.rank_map() == [("a", [0, 1]), ("b", [2, 3])] and sim.round.cause == Cause.membership
    assert c.nodes["c"].role == Role.standby and sim.nodes["c"].state == Role.standby
    assert restarts(sim)["failure"] == 0


def test_nodes_without_shim_ranks_are_told_but_not_waited_for() -> None:
    """A node that answers the step query with no shim rank would never say `drained`: nobody waits for it. It is
    told all the same, for the shim workers it may still be starting (their `welcome` carries the request): a
    plain job's join tells every node that no step was agreed; a plain node leaving a shim job is not waited for."""
    sim = Sim("abc", min_nodes=2, max_nodes=4)  # plain workers everywhere
    sim.start()
    sim.formed()
    mark = sim.mark()
    sim.add("d").start()
    sim.formed(2)
    assert len(sim.msgs(MeshOp.step_report, since=mark)) == 3
    agreed, = sim.of(K.step_agreed, since=mark)
    drains = sim.msgs(MeshOp.drain_workers, since=mark)
    assert sorted(m.dst for m in drains) == ["a", "b", "c"] and {m.body["at_step"] for m in drains} == {None}
    assert agreed["at_step"] is None and sim.round.world_size == 8

    sim = shim_job()
    sim.nodes["c"].shim = False  # c's workers are plain: it answers with no step
    mark = sim.mark()
    assert verb(sim.coordinator, "drain", {"node": "c"})["accepted"] is True
    sim.formed(2)
    assert sorted(m.dst for m in sim.msgs(MeshOp.drain_workers, since=mark)) == ["a", "b", "c"]
    assert sim.msgs(MeshOp.node_drained, src="c", since=mark) == []
    complete, = sim.of(K.drain_complete, since=mark)
    assert complete["timed_out"] is False and sim.rank_map() == [("a", [0, 1]), ("b", [2, 3])]


def test_drain_interlocks_refuse_rank_0_and_the_coordinator_without_force() -> None:
    sim = Sim("abc", min_nodes=1)
    sim.start("b", "c")
    sim.formed()
    sim.start("a")  # the coordinator's node comes late: rank 0 stays on b (sticky), a is appended
    sim.formed(2)
    c = sim.coordinator
    assert sim.rank_map() == [("b", [0, 1]), ("c", [2, 3]), ("a", [4, 5])]
    mark = sim.mark()
    for node_id, why in (("b", "holds rank 0"), ("a", "is the coordinator")):
        with pytest.raises(ProtocolError, match=why):
            verb(c, "drain", {"node": node_id})
    assert c.transition is None and sim.kinds(since=mark) == [] and c.target == 3
    assert verb(c, "drain", {"node": "b", "force": True})["accepted"] is True
    sim.formed(3)
    assert sim.rank_map() == [("c", [0, 1]), ("a", [2, 3])] and c.nodes["b"].role == Role.standby


def test_scale_down_to_one_and_back_up_promotes_the_standby() -> None:
    sim = Sim("ab", min_nodes=1)
    sim.start()
    sim.formed()
    c = sim.coordinator
    verb(c, "scale", {"nodes": 1})
    sim.formed(2)
    assert sim.rank_map() == [("a", [0, 1])] and c.nodes["b"].role == Role.standby
    assert sim.nodes["b"].state == Role.standby
    verb(c, "scale", {"nodes": 2})
    sim.formed(3)
    assert sim.rank_map() == [("a", [0, 1]), ("b", [2, 3])] and c.nodes["b"].role == Role.active
    assert [(r.world_size, r.cause) for r in sim.rounds()] == [(4, Cause.start), (2, Cause.membership),
                                                               (4, Cause.membership)]
    assert sim.kinds(K.scale_started, K.scale_complete, K.scale_set, K.reform_started, K.reform_complete) == [
        K.scale_started, K.scale_complete, K.scale_set, K.reform_started, K.reform_complete]
    assert restarts(sim) == {"failure": 0, "membership": 2, "operator": 0, "hang": 0}


def test_step_query_a_member_never_answers_resolves_at_the_timeout_with_the_others() -> None:
    sim = shim_job()
    sim.nodes["c"].mute.add(MeshOp.step_query)  # c is the one ahead: its step would have decided at_step
    mark, asked = sim.mark(), sim.clock.now
    verb(sim.coordinator, "checkpoint", {})
    sim.run_until(lambda: bool(sim.of(K.step_agreed, since=mark)), timeout=5.0)
    agreed, = sim.of(K.step_agreed, since=mark)
    assert QUERY_TIMEOUT_S <= agreed["at"] - asked <= QUERY_TIMEOUT_S + sim.tick_s
    answers = sim.msgs(MeshOp.step_report, since=mark)
    assert sorted(m.src for m in answers) == ["a", "b"]
    assert agreed["at_step"] == max(m.body["step"] for m in answers) + MARGIN
    assert sorted(m.dst for m in sim.msgs(MeshOp.checkpoint_workers, since=mark)) == ["a", "b", "c"]
    assert sim.of(K.node_lost) == [] and len(sim.rounds()) == 1


def test_stop_barrier_waits_grace_plus_slack_for_a_node_that_never_stops() -> None:
    sim = Sim("abc", grace_s=2.0)
    sim.start()
    sim.formed()
    sim.nodes["c"].stop_s = None  # its old workers never go away
    mark = sim.mark()
    verb(sim.coordinator, "restart", {})
    sim.run_until(lambda: bool(sim.msgs(MeshOp.go, since=mark)), timeout=30.0)
    started, = sim.of(K.round_started, since=mark)
    timeout, = sim.of(K.stop_barrier_timeout, since=mark)
    go = sim.msgs(MeshOp.go, since=mark)
    limit = sim.cfg.grace_s + STOP_SLACK_S
    assert limit < go[0].at - started["at"] <= limit + sim.tick_s
    assert timeout["nodes"] == ["c"] and timeout["order"] < go[0].order
    sim.run(1.0)
    for node_id in "ab":  # their new workers started only after the go
        spawned = [m for m in sim.msgs(MeshOp.round_progress, src=node_id, since=mark) if "spawned" in m.body]
        assert len(spawned) == 1 and spawned[0].order > go[0].order


def test_registration_storm_of_200_nodes_makes_exactly_one_round() -> None:
    sim = Sim(200, nproc=1, min_nodes=1)
    sim.start(spacing=0.001)  # 0.2 s of registrations, each inside the previous one's settle window
    sim.formed()
    sim.run(3.0)
    assert len(sim.of(K.node_joined)) == 200
    assert sim.kinds(K.round_started) == [K.round_started] and sim.round.world_size == 200
    assert [e.node_id for e in sim.round.members] == [f"n{i:04d}" for i in range(200)]


def test_nodes_that_register_one_by_one_below_min_hear_once_that_the_job_waits() -> None:
    """Each registration in its own settle window re-checks the wait: O(N) frames in all, not O(N²)."""
    sim = Sim(100, nproc=1, min_nodes=100)
    sim.start(spacing=0.3)  # 30 s of registrations, each past the previous one's settle window
    sim.formed(timeout=60)
    told = [m for m in sim.msgs(MeshOp.round) if m.body.get("round") is None]
    assert len(sim.of(K.waiting)) >= 90  # the wait was re-checked at (nearly) every registration
    assert len(told) <= 100 and len({m.dst for m in told}) == len(told)
    assert sim.round.world_size == 100


def test_the_join_timeout_counts_from_the_first_wait_not_from_the_coordinators_own_warm_up() -> None:
    """Its own node's zygote may take seconds to import torch on a loaded host: that is not waiting for others."""
    sim = Sim("ab", nproc=1, join_timeout_s=6.0)
    sim.run(10.0)  # nobody registered yet (the coordinator's node still warming): no wait, no timeout
    assert sim.kinds() == [] and sim.coordinator.state == JobState.waiting
    sim.start("a")
    sim.run(5.0)
    waiting, = sim.of(K.waiting)
    assert "waiting for 1 more node(s)" in waiting["reason"] and sim.coordinator.state == JobState.waiting
    sim.run(1.5)  # 6 s after the wait began
    end, = sim.of(K.job_end)
    assert end["state"] == JobState.failed and "join timeout" in end["reason"]
    assert end["ts"] - waiting["ts"] == pytest.approx(6.0, abs=0.2)


def test_a_node_that_announced_it_is_warming_up_holds_the_join_timeout_until_it_registers() -> None:
    sim = Sim("ab", nproc=1, join_timeout_s=6.0)
    sim.start("a")
    sim.run(5.0)
    sim.to_coordinator(sim.nodes["b"], MeshOp.announce, {})  # b's daemon started; its zygote imports torch
    sim.run(8.0)  # past a's 6 s of waiting: b is coming, so the job still waits
    assert sim.kinds(K.job_end) == [] and sim.coordinator.state == JobState.waiting
    sim.start("b")
    assert sim.formed().world_size == 2


def test_a_storm_past_the_target_makes_the_rest_standby_and_losses_promote_them() -> None:
    """Roles come from a kept count of active nodes (not a scan per registration): it must stay exact."""
    sim = Sim(200, nproc=1, min_nodes=1, max_nodes=150)
    sim.start(spacing=0.001)
    sim.formed()
    counts = sim.coordinator.status(sim.clock.now, limit=0)["node_counts"]
    assert counts == {"alive/active": 150, "alive/standby": 50} and sim.round.world_size == 150
    for node_id in ("n0003", "n0100", "n0149"):
        sim.nodes[node_id].kill()
    sim.formed(2)
    counts = sim.coordinator.status(sim.clock.now, limit=0)["node_counts"]
    assert counts == {"alive/active": 150, "alive/standby": 47, "lost": 3} and sim.round.world_size == 150
    sim.add("late").start()  # the job is at its target: a newcomer waits as a standby, no round
    sim.run(2.0)
    assert sim.coordinator.nodes["late"].role == Role.standby and sim.round.round_id == 2


@pytest.mark.parametrize(("change", "gone"), [("drain", "killed"), ("join", "left")])
def test_a_member_gone_during_a_graceful_stop_abandons_it_and_reforms_promptly(change: str, gone: str) -> None:
    sim = shim_job("abcd", max_nodes=5)
    sim.configure(save_s=1.0)  # saving takes a while: b is gone before it says drained
    mark = sim.mark()
    if change == "drain":
        verb(sim.coordinator, "drain", {"node": "d"})
    else:  # a join re-forms: healthy shim workers stop at one step first
        sim.add("e", shim=True, save_s=1.0).start()
    sim.run_until(lambda: bool(sim.of(K.step_agreed, since=mark)))
    gone_at = sim.clock.now
    if gone == "killed":
        sim.nodes["b"].kill()
    else:
        sim.nodes["b"].leave()
    sim.run_until(lambda: sim.round.round_id == 2, timeout=DRAIN_TIMEOUT_S + 5)
    # docs/architecture.md: "A failure or a lost node during a graceful stop abandons it"
    noticed = RECONNECT_GRACE_S if gone == "killed" else 0.0  # its connection closed
    assert sim.clock.now - gone_at < noticed + 1.0
    abandoned = K.drain_abandoned if change == "drain" else K.reform_abandoned
    assert abandoned in sim.kinds(since=mark) and "b" not in sim.round.node_ids()


def test_sigterm_leave_drains_every_rank_at_one_step_then_lets_the_node_go() -> None:
    """A preemption notice takes the drain path: survivors resume after the agreed step, nothing is charged."""
    sim = shim_job()
    mark = sim.mark()
    sim.nodes["c"].leave("SIGTERM", graceful=True)
    sim.formed(2)
    agreed, = sim.of(K.step_agreed, since=mark)
    assert sim.kinds(K.drain_started, K.step_agreed, K.drain_complete, K.node_left, K.round_started,
                     since=mark) == [K.drain_started, K.step_agreed, K.drain_complete, K.node_left, K.round_started]
    assert sorted(m.src for m in sim.msgs(MeshOp.node_drained, since=mark)) == ["a", "b", "c"]
    left, = sim.msgs(MeshOp.left, since=mark)
    assert left.dst == "c" and sim.nodes["c"].ended == (JobState.stopped, "SIGTERM")
    assert sim.rank_map() == [("a", [0, 1]), ("b", [2, 3])] and sim.round.cause == Cause.membership
    assert agreed["at_step"] is not None and restarts(sim)["failure"] == 0
    assert "c" not in [n["node_id"] for n in sim.coordinator.status(sim.clock.now)["nodes"]
                       if n["status"] == "alive"]


def test_two_notices_at_once_make_one_drain_and_one_round() -> None:
    sim = shim_job("abcd")
    mark = sim.mark()
    sim.nodes["c"].leave("SIGTERM", graceful=True)
    sim.nodes["d"].leave("SIGTERM", graceful=True)
    sim.formed(2)
    assert sim.kinds(K.drain_started, K.round_started, since=mark) == [K.drain_started, K.round_started]
    assert sorted(m.dst for m in sim.msgs(MeshOp.left, since=mark)) == ["c", "d"]
    assert sim.rank_map() == [("a", [0, 1]), ("b", [2, 3])]


def test_a_job_wide_signal_folds_the_leaves_and_the_coordinators_stop_into_one_agreed_step() -> None:
    """A scheduler signals every node at once: leaves within the signal window and the coordinator's own stop make
    one transition; every rank saves at its one agreed step (a drain, never an in-place resize), then the job ends."""
    sim = shim_job("abcd")
    mark = sim.mark()
    sim.nodes["c"].leave("SIGTERM", graceful=True)
    sim.run(SIGNAL_WINDOW_S / 2)
    assert sim.kinds(K.step_agreed, since=mark) == []  # the window is still open: no step asked yet
    sim.nodes["d"].leave("SIGTERM", graceful=True)
    sim.coordinator.stop_gracefully("node a's elasticd received SIGTERM")
    sim.run_until(lambda: sim.coordinator.state == JobState.stopped, timeout=DRAIN_TIMEOUT_S)
    assert sim.kinds(K.drain_started, K.step_agreed, K.drain_complete, K.round_started, K.job_end, since=mark) == \
        [K.drain_started, K.step_agreed, K.drain_complete, K.job_end]
    agreed, = sim.of(K.step_agreed, since=mark)
    assert agreed["op"] == "drain" and agreed["at_step"] is not None
    assert sorted(m.src for m in sim.msgs(MeshOp.node_drained, since=mark)) == ["a", "b", "c", "d"]
    assert sorted(m.dst for m in sim.msgs(MeshOp.left, since=mark)) == ["c", "d"]
    assert "SIGTERM" in sim.coordinator.reason


def test_a_leave_with_plain_workers_or_when_the_grace_runs_out_still_goes() -> None:
    """No shim: nothing to agree on, the node goes at once; a drain that outlasts the grace ends on the fast path."""
    plain = Sim("abc", min_nodes=1)
    plain.start()
    plain.formed()
    mark = plain.mark()
    plain.nodes["c"].leave("SIGTERM", graceful=True)
    plain.formed(2)
    agreed, = plain.of(K.step_agreed, since=mark)
    assert agreed["at_step"] is None and plain.nodes["c"].ended is not None
    assert plain.rank_map() == [("a", [0, 1]), ("b", [2, 3])]
    slow = shim_job()
    slow.configure(save_s=2 * slow.cfg.grace_s)  # the drain cannot end within the grace
    mark = slow.mark()
    slow.nodes["c"].leave("SIGTERM", graceful=True)
    slow.formed(2)
    assert K.drain_abandoned in slow.kinds(since=mark) and "c" not in slow.round.node_ids()
    assert slow.msgs(MeshOp.leave, src="c", since=mark)[-1].body.get("graceful") is None
    assert restarts(slow)["failure"] == 0


def test_a_lost_round_or_go_is_resent_on_the_members_next_heartbeat() -> None:
    """The mesh may drop a frame under a burst: a member learns what it missed from its heartbeat's answer."""
    for lost in (MeshOp.round, MeshOp.go):
        sim = Sim("abc", min_nodes=1)
        sim.start()
        sim.formed()
        sim.nodes["c"].mute.add(lost)
        mark = sim.mark()
        verb(sim.coordinator, "restart", {})
        sim.run(0.5)
        sim.nodes["c"].mute.clear()  # the next one gets through
        sim.formed(2, timeout=5.0)
        assert sim.rank_map() == [("a", [0, 1]), ("b", [2, 3]), ("c", [4, 5])]
        assert len(sim.msgs(lost, dst="c", since=mark)) == 2  # the lost one and the resent one, nothing more
        assert sim.kinds(K.round_started, since=mark) == [K.round_started]


def test_a_repeated_register_from_a_welcomed_daemon_is_answered_again_and_changes_nothing() -> None:
    sim = Sim("abc", min_nodes=1)
    sim.start()
    sim.formed()
    mark = sim.mark()
    sim.nodes["b"].register()  # its welcome was lost, say: the same instance asks again
    sim.run(1.0)
    welcome, = sim.msgs(MeshOp.welcome, dst="b", since=mark)
    assert welcome.body == {"ok": True, "role": Role.active, "round": 1, "events_pub": "", "prewarm": False,
                            "expected_world": 0, "via": ""}
    assert [m.op for m in sim.msgs(MeshOp.round, dst="b", since=mark)] == [MeshOp.round]  # its part, resent
    assert sim.kinds(since=mark) == [] and sim.round.round_id == 1  # no join, no round



def test_a_second_daemon_with_a_live_nodes_id_is_refused_with_a_code() -> None:
    sim = Sim("ab", min_nodes=1)
    sim.start()
    sim.formed()
    b = sim.nodes["b"]
    twin = Register("another", "twin.sim", b.nproc, ports=b.ports)
    refusal = sim.coordinator.registration.register("b", twin, sim.clock.now)
    assert (refusal.ok, refusal.errno, refusal.code) == (False, ErrorCode.DUPLICATE_NODE, "duplicate_node")
    assert refusal.reason.startswith("node id 'b' is already in job")  # the text a person reads stays
    assert sim.coordinator.nodes["b"].instance == b.instance  # the live one keeps its place

@pytest.mark.parametrize("nodes", [64, 512])
def test_a_round_costs_the_coordinator_a_constant_number_of_frames_per_node(nodes: int) -> None:
    """Formation, a join, a node loss: each costs the coordinator at most FRAMES_PER_NODE frames per node, in
    and out together (O(N), not O(N²)).

    A member's part of a graceful round (a join re-forms) is `step_query` and its `step_report`,
    `drain_workers`, its `round`, `round_progress` when its old workers stopped, `go`, and `round_progress`
    when its new ones started: 7. Its `workers_stopped`/`workers_started` events ride on those two
    `round_progress` frames (a member of the real daemon sends them so; these simulated ones send none), else
    they would be 2 more. 8 leaves one for a resend or a `probe`; relaying every event to everyone cost N.
    Heartbeats and their answers are steady traffic (one each per node per second), not the round's.
    """
    sim = Sim(nodes, nproc=8, min_nodes=1, max_nodes=nodes + 1)
    sim.start()
    sim.formed(timeout=120)
    for change in ("join", "loss"):
        mark = sim.mark()
        if change == "join":
            sim.add("new").start()
        else:
            sim.nodes["n0003"].kill()
        sim.formed(sim.round.round_id + 1, timeout=60)
        frames = [m for m in sim.sent if m.order >= mark and COORD in (m.src, m.dst) and m.op != MeshOp.hb]
        assert len(frames) <= FRAMES_PER_NODE * (nodes + 1), (change, len(frames))


def test_a_5s_stall_of_the_coordinators_loop_declares_nobody_lost() -> None:
    """Members kept beating while the coordinator stood still: their silence was its own."""
    sim = Sim("abcd", min_nodes=1)
    sim.start()
    sim.formed()
    mark = sim.mark()
    sim.stall_coordinator(5.0)
    sim.run(5.0)
    assert sim.kinds(K.node_lost, K.round_started, since=mark) == []
    assert sim.round.round_id == 1


def test_a_stall_with_nothing_waiting_still_gives_the_members_their_time_back() -> None:
    """Even with no frame queued (the members' beats were lost too), a stall is not charged to them."""
    sim = Sim("abcd", min_nodes=1)
    sim.start()
    sim.formed()
    mark = sim.mark()
    sim.stall_coordinator(5.0, lose_waiting=True)
    sim.run(0.5)
    assert sim.kinds(K.node_lost, since=mark) == []
    # ... and the members, who judge the coordinator's silence too, hear from it at once, all together
    resumed = [m for m in sim.msgs(MeshOp.hb, since=mark) if "beat" not in m.body]
    assert sorted(m.dst for m in resumed) == ["b", "c", "d"] and len({m.at for m in resumed}) == 1


def test_status_pages_the_node_list_and_counts_every_node() -> None:
    sim = Sim(6, min_nodes=1)
    sim.start()
    sim.formed()
    sim.nodes["n0005"].kill()
    sim.formed(2)
    whole = verb(sim.coordinator, "status", {})
    page = verb(sim.coordinator, "status", {"nodes_offset": 2, "nodes_limit": 3})
    assert [n["node_id"] for n in whole["nodes"]] == [f"n{i:04d}" for i in range(6)]
    assert [n["node_id"] for n in page["nodes"]] == ["n0002", "n0003", "n0004"]
    assert (page["nodes_total"], page["nodes_offset"]) == (6, 2)
    assert page["node_counts"] == {"alive/active": 5, "lost": 1} == whole["node_counts"]
    assert "nodes 3-5 of 6 (5 alive/active, 1 lost)" in REGISTRY["status"].render(REGISTRY["status"].answer(page))
    with pytest.raises(ProtocolError):
        verb(sim.coordinator, "status", {"nodes_limit": -1})


def test_a_join_waits_for_the_in_place_generation_in_flight_and_is_bounded() -> None:
    """Two nodes started a moment apart: the second's round waits for the first's in-place generation to sync
    (its `resize`), instead of abandoning it and restarting every worker from the last checkpoint."""
    sim = Sim("abc", min_nodes=1, max_nodes=3)
    sim.start("a")
    rnd = sim.formed()
    resizer = sim.coordinator.resizer
    resizer.job_store_started("127.0.0.1:1", "")
    marks = {"detect": sim.clock.now, "agreed": sim.clock.now}
    resizer.current = InPlaceRound(rnd.round_id, {"a"}, sim.clock.now, dict(marks))
    sim.start("b")
    sim.run(2.0)
    assert sim.round.round_id == rnd.round_id and sim.coordinator.pending is not None  # b's round waits
    resizer.progress("a", ProgressReport(rnd.round_id, group_ready=sim.clock.now, synced=sim.clock.now), rnd)
    resizer.first_step(rnd, sim.clock.now)
    assert sim.kinds(EventKind.resize)[-1:] == [EventKind.resize]
    assert sim.formed(2).node_ids() == ["a", "b"]
    resizer.current = InPlaceRound(2, {"a", "b"}, sim.clock.now, dict(marks))  # never syncs
    sim.start("c")
    sim.run(RESIZE_TIMEOUT_S - 1.0)
    assert sim.round.round_id == 2
    assert sim.formed(3, timeout=5.0).node_ids() == ["a", "b", "c"]  # waited no longer than the resize's own limit


def test_a_node_joining_an_in_place_job_prestarts_for_the_world_it_will_make() -> None:
    """Its welcome says `prewarm` and the world with it added: its sharded workers rehearse that world's rebuild
    while the others train (trainer_shim/prestart.py)."""
    sim = Sim("ab", min_nodes=1, max_nodes=2)
    sim.start("a")
    rnd = sim.formed()
    resizer = sim.coordinator.resizer
    resizer.job_store_started("127.0.0.1:1", "")
    resizer.progress("a", ProgressReport(rnd.round_id, in_place=True), rnd)  # a's ranks resize in place
    mark = sim.mark()
    sim.start("b")
    sim.run(1.0)
    welcome = sim.msgs(MeshOp.welcome, dst="b", since=mark)[0]
    assert (welcome.body["prewarm"], welcome.body["expected_world"]) == (True, 4), welcome.body


def test_a_standby_of_an_in_place_job_prestarts_for_the_world_it_would_make() -> None:
    """A node drained out of an in-place job at --nnodes max stays a standby with its workers started (a hot spare):
    its round says the world it would make, the job's with its processes added, which its sharded workers rehearse;
    the members' rounds say none."""
    sim = Sim("abc", min_nodes=1, max_nodes=2)
    sim.configure(shim=True, step_time=0.1, save_s=0.2)
    sim.start(spacing=0.01)
    rnd = sim.formed()
    resizer = sim.coordinator.resizer
    resizer.job_store_started("127.0.0.1:1", "")
    for node_id in "ab":  # their ranks resize in place
        resizer.progress(node_id, ProgressReport(rnd.round_id, in_place=True), rnd)
    sim.run(2.0)
    mark = sim.mark()
    assert verb(sim.coordinator, "drain", {"node": "b"})["accepted"] is True
    sim.run_until(lambda: sim.round.round_id == 2 and sim.settled(), 30.0)
    standby = RoundAssignment.decode(sim.msgs(MeshOp.round, dst="b", since=mark)[-1].body)
    member = RoundAssignment.decode(sim.msgs(MeshOp.round, dst="a", since=mark)[-1].body)
    assert member.in_place and (member.prewarm, member.expected_world) == (False, 0), member
    assert (standby.state, standby.prewarm, standby.expected_world) == ("standby", True, 6), standby


def drained_to_a_hot_spare(ids: str, drained: str, warm_s: float) -> Sim:
    """An in-place job whose node `drained` was just drained to a standby told to keep hot spares, which take
    `warm_s` to say `warm`."""
    sim = Sim(ids, min_nodes=1, max_nodes=len(ids))
    sim.configure(shim=True, step_time=0.1, save_s=0.2, warm_s=warm_s)
    sim.start(spacing=0.01)
    rnd = sim.formed()
    resizer = sim.coordinator.resizer
    resizer.job_store_started("127.0.0.1:1", "")
    for node_id in ids:  # their ranks resize in place
        resizer.progress(node_id, ProgressReport(rnd.round_id, in_place=True), rnd)
    sim.run(2.0)
    mark = sim.mark()
    assert verb(sim.coordinator, "drain", {"node": drained})["accepted"] is True
    sim.run_until(lambda: sim.round.round_id == 2)
    assert RoundAssignment.decode(sim.msgs(MeshOp.round, dst=drained, since=mark)[-1].body).prewarm
    for node_id in sim.round.node_ids():  # the drain's generation synced (the sim's nodes do not say so)
        now = sim.clock.now
        resizer.progress(node_id, ProgressReport(2, in_place=True, group_ready=now, synced=now), sim.round)
    resizer.first_step(sim.round, sim.clock.now)
    return sim


def test_a_scale_right_after_a_drain_waits_for_the_drained_nodes_hot_spares() -> None:
    """They start when the drain's round makes it a standby: the scale that adds it back waits until they are up,
    as a joiner's round does, instead of finding them still loading and forking cold workers."""
    sim = drained_to_a_hot_spare("ab", "b", warm_s=3.0)
    mark = sim.mark()
    assert verb(sim.coordinator, "scale", {"nodes": 2})["accepted"] is True
    sim.run_until(lambda: sim.round.round_id == 3, 20.0)
    warm, = sim.msgs(MeshOp.warm, src="b")
    started, = sim.of(K.round_started, since=mark)
    assert warm.at <= started["at"] < warm.at + 1.0 and sim.rank_map() == [("a", [0, 1]), ("b", [2, 3])]


def test_a_node_lost_while_a_standbys_spares_warm_up_reforms_at_once() -> None:
    """The loss broke the round: its survivors wait for no warm-up (a joiner's, or a drained node's spares)."""
    sim = drained_to_a_hot_spare("abc", "c", warm_s=20.0)
    mark, killed = sim.mark(), sim.clock.now
    sim.nodes["b"].kill()
    sim.nodes["a"].fail_worker()  # its collective with b broke
    sim.run_until(lambda: sim.round.round_id == 3, 5.0)
    started, = sim.of(K.round_started, since=mark)
    assert started["at"] - killed < 1.0 and sim.msgs(MeshOp.warm, src="c") == []


def test_a_drain_whose_spare_still_loads_asks_the_step_once_the_spare_is_up() -> None:
    """c, drained a moment ago, takes b's place: b's drain asks for the step only once c's spares are up (the job
    trains meanwhile), so the round after it neither forks cold workers for c nor holds every rank waiting."""
    sim = drained_to_a_hot_spare("abc", "c", warm_s=3.0)
    mark = sim.mark()
    assert verb(sim.coordinator, "drain", {"node": "b"})["accepted"] is True
    sim.run_until(lambda: sim.round.round_id == 3, 20.0)
    warm, = sim.msgs(MeshOp.warm, src="c")
    asked = [m.at for m in sim.msgs(MeshOp.step_query, since=mark)]
    assert asked and min(asked) >= warm.at and sim.rank_map() == [("a", [0, 1]), ("c", [2, 3])]


def test_each_member_s_round_is_the_shared_fields_with_its_own_part_over_them() -> None:
    """A round is sent as its shared fields encoded once, each node's part over them: every member must read the
    record `assignment` would have built for it alone (a standby too: no ranks, its role for a state)."""
    sim = Sim("abcd", min_nodes=1, max_nodes=3)  # d: past --nnodes max, a standby
    sim.start()
    sim.formed()
    for node_id in "abcd":
        sent = sim.msgs(MeshOp.round, dst=node_id)[-1]
        assert RoundAssignment.decode(sent.body, "round") == sim.coordinator.assignment(node_id)
    parts = {n: RoundAssignment.decode(sim.msgs(MeshOp.round, dst=n)[-1].body) for n in "abcd"}
    assert [(p.state, p.group_rank, p.ranks) for p in parts.values()] == [
        ("running", 0, [0, 1]), ("running", 1, [2, 3]), ("running", 2, [4, 5]), ("standby", None, [])]
    assert len({(p.world_size, p.master_port, p.round) for p in parts.values()}) == 1
