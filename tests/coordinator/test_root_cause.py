"""Which failure of a round is named its root cause, whichever reaches the coordinator first."""

from __future__ import annotations

import pytest
from support.sim import Sim

from elasticd.wire.names import EventKind, MeshOp

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

GLOO_PEER_LOST = ("RuntimeError", "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:1220: Connection reset by "
                  "peer. This is typically caused by a remote worker hanging or bugs in the application.")
NCCL_PEER_LOST = ("DistBackendError", "NCCL error: remote process exited or there was a network error")


def failed(sim: Sim, since: int) -> list[tuple[str, bool, object]]:
    return [(e["node"], e["root_cause"], e.get("consequence_of")) for e in sim.of(EventKind.worker_failed, since=since)]


@pytest.mark.parametrize("peer_lost", [GLOO_PEER_LOST, NCCL_PEER_LOST])
def test_the_rank_that_raised_is_the_root_cause_though_its_peer_on_the_coordinators_node_reported_first(
        peer_lost: tuple[str, str]) -> None:
    sim = Sim("abc", max_restarts=3)
    sim.start()
    sim.formed()
    mark = sim.mark()
    b_rank = sim.nodes["b"].assignment["ranks"][0]
    sim.nodes["a"].fail_worker(error=peer_lost)  # the coordinator's own node: its report arrives first
    sim.nodes["b"].fail_worker(error=("ValueError", "bad batch at step 7"))
    sim.formed(2)
    assert failed(sim, mark) == [("b", True, None), ("a", False, {"node": "b", "rank": b_rank})]
    assert sim.coordinator.probe.root_cause()["node"] == "b"  # what `status` shows
    started, = sim.of(EventKind.round_started, since=mark)
    assert started["detail"] == f"worker rank {b_rank} on node b exited with exit code 1"  # the round says why
    assert list(sim.coordinator.health.failures) == ["b"]  # the lemon count is charged to the node that raised


def test_of_two_failures_that_both_raised_on_their_own_the_earlier_is_the_root_cause() -> None:
    """Both reported while the probe still waits (d answers late): a confirmed failure's round starts at once, and
    then stops every other worker of the failed round, so a later failure is never reported."""
    sim = Sim("abcd", max_restarts=3)
    sim.start()
    sim.formed()
    mark = sim.mark()
    sim.nodes["d"].freeze()
    sim.nodes["b"].fail_worker(error=("ValueError", "bad batch"))
    sim.run(0.01)
    sim.nodes["c"].fail_worker(error=("KeyError", "'x'"))
    sim.run(0.05)
    sim.nodes["d"].thaw()
    sim.formed(2)
    assert [(node, root) for node, root, _ in failed(sim, mark)] == [("b", True), ("c", False)]


def test_no_failure_is_published_before_every_member_answered_the_probe() -> None:
    sim = Sim("abc", max_restarts=3)
    sim.start()
    sim.formed()
    mark = sim.mark()
    sim.nodes["c"].freeze()  # it answers no probe yet
    sim.nodes["b"].fail_worker(error=("ValueError", "bad batch"))
    sim.run(0.05)
    assert sim.msgs(MeshOp.probe, since=mark) and failed(sim, mark) == []
    sim.nodes["c"].thaw()
    sim.formed(2)
    assert failed(sim, mark)[0][:2] == ("b", True)
