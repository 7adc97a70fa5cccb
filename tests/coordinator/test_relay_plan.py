"""Who relays for whom, and what a relay's loss costs: the coordinator's side, on the simulator's fake clock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from support.sim import COORD, Sim

from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.etcd.store import Snapshot
from elasticd.coordinator.membership import MemoryStore
from elasticd.coordinator.relay_plan import RelayPlan
from elasticd.daemon.takeover import restore
from elasticd.job.config import JobConfig
from elasticd.job.events import EventLog
from elasticd.wire.member_state import Register
from elasticd.wire.names import EventKind, MeshOp

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

K = EventKind
GROUP = 3


def relay_sim(nodes: int = 10) -> Sim:
    """A formed job with relays of GROUP members each (a small job told to have them, as a large one has)."""
    sim = Sim(nodes, nproc=1, min_nodes=nodes - 2, relay_group=GROUP, relay_from=1)
    sim.start(spacing=0.01)
    sim.formed()
    sim.run(1.5)
    return sim


def groups(sim: Sim) -> dict[str, list[str]]:
    """relay -> its members, as the members themselves send (their `via`)."""
    by_endpoint = {n.relay_endpoint: n.node_id for n in sim.nodes.values()}
    found: dict[str, list[str]] = {}
    for node in sim.nodes.values():
        if node.via and not node.killed:
            found.setdefault(by_endpoint[node.via], []).append(node.node_id)
    return {relay: sorted(members) for relay, members in found.items()}


def test_members_fill_each_relay_up_to_its_group_then_a_newcomer_becomes_the_next_relay() -> None:
    plan = RelayPlan(size=2)
    placed = {n: plan.place(n, can_relay=True) for n in "abcdefg"}
    assert placed == {"a": "", "b": "a", "c": "a", "d": "", "e": "d", "f": "d", "g": ""}
    assert plan.groups == {"a": {"b", "c"}, "d": {"e", "f"}, "g": set()}
    assert plan.place("h", can_relay=False) == "g" and plan.place("i", can_relay=False) == "g"
    assert plan.place("j", can_relay=False) == ""  # no room anywhere and it offers no relay: direct
    assert plan.place("b", can_relay=True) == "a"  # placing again changes nothing


def test_a_relays_loss_makes_the_first_of_its_group_that_can_relay_the_relay_of_the_rest() -> None:
    plan = RelayPlan(size=3)
    for node in "abcd":
        plan.place(node, can_relay=True)
    order = {"b": (1, 2), "c": (0, 3), "d": (0, 4)}  # b offers no relay: c comes first
    successor, moved = plan.remove("a", order.__getitem__)
    assert (successor, moved) == ("c", {"b", "c", "d"})
    assert plan.groups == {"c": {"b", "d"}} and plan.via == {"b": "c", "d": "c"}
    assert plan.remove("d", order.__getitem__) == ("", set())  # a member's loss moves nobody
    assert plan.groups == {"c": {"b"}}


def test_every_member_sends_through_a_relay_of_its_group_or_is_one() -> None:
    sim = relay_sim()
    c = sim.coordinator
    found = groups(sim)
    assert found and all(len(members) <= GROUP for members in found.values())
    relays = set(c.relays.groups)  # relays, including one whose group has nobody yet
    assert set(found) <= relays
    for node_id, node in sim.nodes.items():
        record = c.nodes[node_id]
        assert record.via == c.relays.via_of(node_id)
        if node_id == sim.cfg.node_id or node_id in relays:
            assert node.via == "" and record.via == ""
        else:
            assert node.via == sim.nodes[record.via].relay_endpoint
    assert c.status(sim.clock.now)["relays"] == len(relays) == -(-(len(sim.nodes) - 1) // (GROUP + 1))
    joined = {e["node"]: e.get("via", "") for e in sim.of(K.node_joined)}
    assert all(joined[n] == c.nodes[n].via for n in sim.nodes)  # node_joined says where it sends


def test_a_sigkilled_relay_is_one_node_lost_and_its_group_sends_through_the_first_of_it() -> None:
    sim = relay_sim()
    relay, members = next(iter(groups(sim).items()))
    mark = sim.mark()
    sim.nodes[relay].kill()
    sim.formed(2)
    sim.run(10.0)
    assert [e["node"] for e in sim.of(K.node_lost, since=mark)] == [relay]  # its group lost nothing
    replaced, = sim.of(K.relay_replaced, since=mark)
    assert replaced["node"] == relay and replaced["relay"] == members[0] and replaced["nodes"] == len(members)
    assert groups(sim).get(members[0], []) == members[1:]
    assert sim.round.world_size == len(sim.nodes) - 1 and sim.kinds(K.round_started, since=mark) == [K.round_started]


def test_a_frozen_relay_costs_its_group_nothing_while_it_is_judged_and_after() -> None:
    """Its members' frames wait in it: their silence is the relay's, not theirs, until the relay is lost; then each
    gets a fresh window and a new relay."""
    sim = relay_sim()
    relay, members = next(iter(groups(sim).items()))
    mark = sim.mark()
    sim.nodes[relay].freeze()
    sim.run(6.0)
    assert [e["node"] for e in sim.of(K.node_lost, since=mark)] == [relay]
    assert groups(sim).get(members[0], []) == members[1:]
    sim.nodes[relay].thaw()  # it hears `unknown` and registers again: a member of some group now
    sim.run(10.0)
    assert [e["node"] for e in sim.of(K.node_lost, since=mark)] == [relay]
    assert sim.coordinator.nodes[relay].status == "alive"


def test_a_member_off_its_assignment_is_told_again_once_an_interval_and_a_failed_relay_makes_it_direct() -> None:
    sim = relay_sim()
    relay, members = next(iter(groups(sim).items()))
    node = sim.nodes[members[0]]
    node.mute.add(MeshOp.relay)  # it does not act on `relay`: its heartbeats keep saying it is direct
    node.via = ""
    mark = sim.mark()
    sim.run(5.0)
    told = sim.msgs(MeshOp.relay, src=COORD, dst=node.node_id, since=mark)
    assert 3 <= len(told) <= 6 and {m.body["via"] for m in told} == {sim.nodes[relay].relay_endpoint}
    node.send(MeshOp.hb, {**node.heartbeat_body(), "via_failed": sim.nodes[relay].relay_endpoint})
    sim.run(0.1)
    assert sim.coordinator.nodes[node.node_id].via == "" and sim.coordinator.relays.via_of(node.node_id) == ""
    mark = sim.mark()
    sim.run(3.0)
    assert sim.msgs(MeshOp.relay, dst=node.node_id, since=mark) == [] and sim.of(K.node_lost) == []


def test_a_takeover_keeps_the_groups_and_moves_the_new_coordinators_own_group() -> None:
    """With etcd the records keep each member's relay; the daemon that takes over may have been a relay itself."""
    cfg = JobConfig(1, 8, 1, "127.0.0.1", 29400, "job", "a", ["train.py"], relay_group=2, relay_from=1)
    old = Coordinator(cfg, MemoryStore(), lambda *_: None, EventLog(), lambda _e: None)
    for seq, node_id in enumerate("abcdef", 1):
        old.registration.register(node_id, Register(f"i-{node_id}", "h", 1, relay=f"tcp://{node_id}:1"), float(seq))
    assert old.relays.groups == {"b": {"c", "d"}, "e": {"f"}}
    sent: list[tuple[str, str, dict[str, Any]]] = []
    new = Coordinator(replace(cfg, node_id="b"), MemoryStore(), lambda *m: sent.append(m), EventLog(),
                      lambda _e: None)
    for record in old.nodes.values():
        new.store.put_node(replace(record))
    restore(new, Snapshot(nodes=dict(new.nodes), alive={n: f"i-{n}" for n in "abcdef"}), 10.0)
    assert new.relays.groups == {"c": {"d"}, "e": {"f"}}  # b coordinates now: its group follows c
    assert {n: r.via for n, r in new.nodes.items()} == {"a": "", "b": "", "c": "", "d": "c", "e": "", "f": "e"}
    assert [(n, b["via"]) for n, op, b in sent if op == MeshOp.relay] == [("c", ""), ("d", "tcp://c:1")]
    assert [e["kind"] for e in new.events.query()] == [K.relay_replaced]
