"""Node health on the coordinator (fake clock, in-memory mesh): sick nodes and lemons out, spares in."""

from __future__ import annotations

import pytest
from support.sim import Sim, verb

from elasticd.commands.registry import REGISTRY
from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.health import BELOW_MIN, CORDON, CORDONED, HOSTS_COORDINATOR, LEFT_OUT
from elasticd.wire.names import EventKind, HealthCheck, MeshOp, Role

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

K = EventKind
FAILING = {"checks": ["command", "log_dir"], "findings": [{"check": "command", "reason": "nvme0: SMART critical"}]}
PASSING = {"checks": ["command", "log_dir"], "findings": []}


def with_spare(ids: str = "abcd", min_nodes: int = 2) -> Sim:
    """Three active shim nodes stepping every 0.1 s and one more as a spare (--nnodes max 3)."""
    sim = Sim(ids, min_nodes=min_nodes, max_nodes=len(ids) - 1, max_restarts=10)
    sim.configure(shim=True, step_time=0.1, save_s=0.2)
    sim.start(spacing=0.01)
    sim.formed()
    sim.run(2.0)
    return sim


def shown(c: Coordinator) -> str:
    """`elasticd status` as the CLI prints it: the reply as sent, decoded into its record, rendered."""
    status = REGISTRY["status"]
    return status.render(status.answer(verb(c, "status", {})))


def report(sim: Sim, node_id: str, body: dict[str, object]) -> None:
    sim.to_coordinator(sim.nodes[node_id], MeshOp.health, body)
    sim.run(0.05)


def test_a_spare_is_ready_only_once_its_first_checks_passed() -> None:
    """A standby node whose checks have not reported yet (a slow --health-check) is not counted on to fill in."""
    sim = with_spare("abc")  # one of them a spare whose checks passed
    c = sim.coordinator
    assert c.status(sim.clock.now)["spares"] == {"ready": 1, "warming": 0}
    sim.add("d", shim=True, step_time=0.1, save_s=0.2, checks_s=None).start()
    sim.run(1.0)
    assert c.nodes["d"].role == Role.standby and c.status(sim.clock.now)["spares"] == {"ready": 1, "warming": 1}
    assert next(n for n in c.status(sim.clock.now)["nodes"] if n["node_id"] == "d")["spare"] == \
        "warming: health checks pending"
    report(sim, "d", PASSING)
    assert c.status(sim.clock.now)["spares"] == {"ready": 2, "warming": 0}


def test_a_node_whose_check_fails_leaves_at_one_step_and_the_spare_takes_its_place() -> None:
    sim = with_spare()
    c, mark = sim.coordinator, sim.mark()
    spare = next(n for n in "abcd" if c.nodes[n].role == Role.standby)
    assert c.status(sim.clock.now)["spares"] == {"ready": 1, "warming": 0}
    sick = next(n for n in sim.round.node_ids()[1:] if n != "a")  # not the coordinator's node
    report(sim, sick, FAILING)
    unhealthy, = sim.of(K.node_unhealthy, since=mark)
    assert unhealthy["node"] == sick and unhealthy["reasons"] == ["command: nvme0: SMART critical"]
    assert unhealthy["action"] == CORDON
    sim.formed(2)
    assert sim.kinds(K.cordon_started, K.step_agreed, K.cordon_complete, K.round_started, since=mark) == [
        K.cordon_started, K.step_agreed, K.cordon_complete, K.round_started]
    assert sorted(sim.round.node_ids()) == sorted({"a", "b", "c", "d"} - {sick}) and spare in sim.round.node_ids()
    assert sim.round.world_size == 6 and c.nodes[sick].role == Role.cordoned
    entry = next(n for n in c.status(sim.clock.now)["nodes"] if n["node_id"] == sick)
    assert entry["health"] == ["command: nvme0: SMART critical"] and entry["checks"] == ["command", "log_dir"]
    row = next(line for line in shown(c).splitlines() if line.startswith(f"{sick} "))
    assert "cordoned" in row and row.endswith("UNHEALTHY command: nvme0: SMART critical")
    assert c.restarts["failure"] == 0

    report(sim, sick, PASSING)  # fixed: said, but it stays out until the operator lets it back
    healed, = sim.of(K.node_healthy, since=mark)
    assert healed["node"] == sick and c.nodes[sick].role == Role.cordoned
    verb(c, "uncordon", {"node": sick})
    assert c.nodes[sick].role == Role.standby and c.status(sim.clock.now)["spares"]["ready"] == 1
    assert "spares: 1 ready, 0 warming" in shown(c)


def test_the_same_verdict_again_does_nothing_more_and_a_standby_is_cordoned_at_once() -> None:
    sim = with_spare()
    c, mark = sim.coordinator, sim.mark()
    spare = next(n for n in "abcd" if c.nodes[n].role == Role.standby)
    report(sim, spare, FAILING)
    report(sim, spare, FAILING)  # each interval while unhealthy: nothing new to do
    unhealthy, = sim.of(K.node_unhealthy, since=mark)
    assert unhealthy["action"] == CORDONED and c.nodes[spare].role == Role.cordoned
    assert c.status(sim.clock.now)["spares"] == {"ready": 0, "warming": 0} and sim.round.round_id == 1


def test_a_sick_node_stays_where_its_leaving_would_end_the_job_and_says_why() -> None:
    sim = with_spare("abc", min_nodes=2)  # two active, one spare
    c, mark = sim.coordinator, sim.mark()
    report(sim, "a", FAILING)  # the coordinator's own node
    assert sim.of(K.node_unhealthy, since=mark)[-1]["action"] == HOSTS_COORDINATOR
    spare = next(n for n in "abc" if c.nodes[n].role == Role.standby)
    report(sim, spare, FAILING)  # no spare left now
    member = next(n for n in sim.round.node_ids() if n != "a")
    report(sim, member, FAILING)
    assert sim.of(K.node_unhealthy, since=mark)[-1]["action"] == BELOW_MIN
    sim.run(3.0)
    assert member in sim.round.node_ids() and sim.round.round_id == 1
    sim.add("d", shim=True, step_time=0.1, save_s=0.2).start()  # a spare comes: now the sick node can go
    sim.formed(2)
    assert member not in sim.round.node_ids() and "d" in sim.round.node_ids() and c.nodes[member].role == Role.cordoned
    assert [e["action"] for e in sim.of(K.node_unhealthy, since=mark) if e["node"] == member] == [BELOW_MIN, CORDON]


def test_a_node_that_causes_three_failures_is_a_lemon_and_the_job_trains_on_without_it() -> None:
    sim = with_spare()
    c = sim.coordinator
    lemon = sim.round.node_ids()[1]
    other = next(m for m in sim.round.node_ids() if m not in ("a", lemon))
    for n in range(3):
        mark = sim.mark()
        sim.nodes[lemon].fail_worker()
        sim.nodes[other].fail_worker()  # its peer fails in the same round: an echo, never counted against it
        sim.formed(2 + n)
    unhealthy, = sim.of(K.node_unhealthy, since=mark)
    assert unhealthy["node"] == lemon and unhealthy["action"] == LEFT_OUT
    assert unhealthy["reasons"] == [f"{HealthCheck.lemon}: 3 root-cause failures within 600s"]
    assert lemon not in sim.round.node_ids() and c.nodes[lemon].role == Role.cordoned
    report(sim, lemon, PASSING)  # its own checks pass: the coordinator's verdict stays, and nothing says healed
    entry = next(n for n in c.status(sim.clock.now)["nodes"] if n["node_id"] == lemon)
    assert entry["health"] == unhealthy["reasons"] and c.status(sim.clock.now)["unhealthy"] == [lemon]
    assert sim.of(K.node_healthy) == []
    assert sim.round.world_size == 6 and other in sim.round.node_ids()  # the spare filled in; the echo's node stays
    assert [e["root_cause"] for e in sim.of(K.worker_failed) if e["node"] == other] == [False] * 3


def test_failures_spread_over_more_than_the_window_make_no_lemon() -> None:
    sim = with_spare()
    node = sim.round.node_ids()[1]
    for n in range(3):
        sim.nodes[node].fail_worker()
        sim.formed(2 + n)
        sim.run(301.0)  # three failures 5 minutes apart: two within any 10 minutes
    assert sim.of(K.node_unhealthy) == [] and node in sim.round.node_ids()


@pytest.mark.parametrize("how", ["drain", "SIGTERM", "SIGKILL"])
def test_a_spare_takes_the_place_of_a_node_drained_leaving_or_lost_in_the_same_round(how: str) -> None:
    sim = with_spare()
    c = sim.coordinator
    spare = next(n for n in "abcd" if c.nodes[n].role == Role.standby)
    if how == "drain":
        planned = verb(c, "drain", {"node": "b", "dry_run": True})["plan"]
        assert (planned["world_after"], planned["nodes_after"]) == (6, ["a", "c", spare])
        verb(c, "drain", {"node": "b"})
    elif how == "SIGTERM":
        sim.nodes["b"].leave("SIGTERM", graceful=True)
    else:
        sim.nodes["b"].kill()
    sim.formed(2)
    assert "b" not in sim.round.node_ids() and spare in sim.round.node_ids() and sim.round.world_size == 6
    assert [r.round_id for r in sim.rounds()] == [1, 2] and c.target == 3
    assert c.restarts["failure"] == 0


def test_the_console_row_says_why_a_node_is_out_and_which_standby_is_a_ready_spare() -> None:
    from tui.model import JobModel
    from tui.rows import node_row

    sim = with_spare()
    c = sim.coordinator
    sick = sim.round.node_ids()[1]
    report(sim, sick, FAILING)
    sim.formed(2)
    verb(c, "uncordon", {"node": sick})  # back as a standby: a spare now
    report(sim, sick, PASSING)
    model = JobModel("simjob", clock=lambda: sim.clock.now)
    model.apply_status(c.status(sim.clock.now))
    row = node_row(model, model.nodes[sick], False, {})
    assert "spare ready" in row[3].plain and row[4] == ""
    report(sim, sick, FAILING)  # and sick again
    model.apply_status(c.status(sim.clock.now))
    row = node_row(model, model.nodes[sick], False, {})
    assert row[4].plain == "UNHEALTHY command: nvme0: SMART critical" and "spare" not in row[3].plain
    mark = sim.mark()
    report(sim, sick, PASSING)
    healed, = sim.of(K.node_healthy, since=mark)
    model.apply_event(healed)
    assert model.nodes[sick].health == []  # the event clears what the last status said
