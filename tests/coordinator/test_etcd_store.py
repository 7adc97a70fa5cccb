"""The MembershipStore contract on both stores; etcd's fencing, cluster check and election; start errors."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.etcd_cluster import EtcdCluster
from support.harness import TICKER, free_port
from support.system_deps import require_binary

from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.etcd.client import EtcdClient, b64, created_at, put
from elasticd.coordinator.etcd.election import Elector, Leader
from elasticd.coordinator.etcd.errors import EtcdClusterChanged
from elasticd.coordinator.etcd.store import Deposed, EtcdStore, Snapshot
from elasticd.coordinator.membership import MembershipStore, MemoryStore, NodeRecord, RankEntry, Round
from elasticd.job.config import JobConfig
from elasticd.job.events import EventLog
from elasticd.wire.member_state import ProgressReport, Register
from elasticd.wire.names import Cause, NodeStatus, Role


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(require_binary("etcd", "etcd-server"), tmp_path_factory.mktemp("etcd")).start()
    yield cluster
    cluster.close()


def client_of(cluster: EtcdCluster) -> EtcdClient:
    return EtcdClient([("127.0.0.1", p) for p in cluster.client_ports])


def campaign(client: EtcdClient, prefix: str) -> tuple[str, int]:
    """A leader key of our own on a fresh lease: (key, epoch)."""
    lease = client.grant(5)
    key = f"{prefix}leader/{lease:x}"
    result = client.txn([created_at(key, 0)], [put(key, "{}", lease)])
    return key, int(result["header"]["revision"])


def etcd_store(cluster: EtcdCluster, history: int) -> tuple[EtcdStore, str]:
    client, prefix = client_of(cluster), f"/elasticd/t{uuid.uuid4().hex[:8]}/"
    key, epoch = campaign(client, prefix)
    return EtcdStore(client, prefix, key, epoch, history=history), prefix


def node(node_id: str, seq: int) -> NodeRecord:
    return NodeRecord(node_id, "10.0.0.1", 2, f"inst-{node_id}", seq, ports=[29500 + seq])


def round_of(round_id: int, nodes: list[str]) -> Round:
    members = [RankEntry(n, i, "10.0.0.1", [2 * i, 2 * i + 1]) for i, n in enumerate(nodes)]
    return Round(round_id, members, 2 * len(nodes), "10.0.0.1", 29500 + round_id, Cause.membership, "test", 1.0,
                 {"detect": 1.0})


@pytest.fixture(params=["memory", "etcd"])
def make_store(request: pytest.FixtureRequest) -> Callable[[int], MembershipStore]:
    if request.param == "memory":
        return lambda history: MemoryStore(history)
    cluster = request.getfixturevalue("etcd")
    return lambda history: etcd_store(cluster, history)[0]


def test_a_store_keeps_nodes_and_the_last_rounds(make_store: Callable[[int], MembershipStore]) -> None:
    store = make_store(3)
    store.put_node(node("a", 1))
    store.put_node(node("b", 2))
    store.nodes()["b"].role = Role.standby  # the coordinator changes records in place
    assert sorted(store.nodes()) == ["a", "b"] and store.nodes()["b"].role == Role.standby
    for round_id in range(1, 6):
        store.put_round(round_of(round_id, ["a", "b"]))
    assert [r.round_id for r in store.rounds()] == [3, 4, 5]
    assert store.rounds()[-1].entry("b") == RankEntry("b", 1, "10.0.0.1", [2, 3])


def test_etcd_holds_the_round_and_everything_before_it_once_put_round_returns(etcd: EtcdCluster) -> None:
    store, prefix = etcd_store(etcd, history=3)
    store.job_state = lambda: {"restarts": {"membership": 4}, "target": 2}
    store.put_node(node("a", 1))
    store.nodes()["a"].status = NodeStatus.lost
    for round_id in range(1, 6):
        store.put_round(round_of(round_id, ["a"]))
    snap = Snapshot.read(client_of(etcd), prefix)  # what a new coordinator would rebuild from
    assert [r.round_id for r in snap.rounds] == [3, 4, 5]
    assert snap.rounds[-1] == store.rounds()[-1]
    assert snap.nodes["a"].status == NodeStatus.lost and snap.nodes["a"].ports == [29501]
    assert snap.job == {"restarts": {"membership": 4}, "target": 2}


def test_a_deposed_coordinator_writes_nothing(etcd: EtcdCluster) -> None:
    """Fencing in etcd: the txn compares the writer's epoch; a newer candidacy in its place fails it atomically."""
    client, prefix = client_of(etcd), f"/elasticd/t{uuid.uuid4().hex[:8]}/"
    key, epoch = campaign(client, prefix)
    old = EtcdStore(client, prefix, key, epoch)
    old.put_round(round_of(1, ["a"]))
    client.revoke(next(kv.lease for kv in client.get_prefix(key)[0]))  # its lease expired: the key is gone
    campaign(client, prefix)  # someone else leads now
    with pytest.raises(Deposed):
        old.put_round(round_of(2, ["a"]))
    assert [r.round_id for r in Snapshot.read(client, prefix).rounds] == [1]


def test_another_etcd_cluster_behind_an_endpoint_is_refused(tmp_path: Path, etcd: EtcdCluster) -> None:
    with EtcdCluster(etcd.binary, tmp_path).start() as other:
        client = EtcdClient([("127.0.0.1", other.client_ports[0]), ("127.0.0.1", etcd.client_ports[0])])
        client.status()
        other.kill_all()  # the client moves on to the next endpoint, which is another cluster
        with pytest.raises(EtcdClusterChanged, match="refusing another cluster's state"):
            client.status()


def test_the_oldest_candidacy_leads_and_a_resignation_hands_over_at_once(etcd: EtcdCluster) -> None:
    prefix = f"/elasticd/t{uuid.uuid4().hex[:8]}/"
    seen: dict[str, list[Leader | None]] = {"a": [], "b": []}
    electors = {n: Elector(client_of(etcd), prefix, n, f"i-{n}", f"tcp://127.0.0.1:{n}", 2, seen[n].append,
                           lambda _h: None, lambda _m: None) for n in "ab"}
    try:
        for n in "ab":
            electors[n].start()
        wait(lambda: seen["b"] and seen["b"][-1] is not None)
        first = seen["b"][-1]
        assert first is not None and first.node_id == "a" and electors["a"].leads() and not electors["b"].leads()
        electors["a"].resign()
        wait(lambda: seen["b"][-1] is not None and seen["b"][-1].node_id == "b")
        second = seen["b"][-1]
        assert second is not None and second.epoch > first.epoch and electors["b"].leads()
    finally:
        for elector in electors.values():
            elector.resign()


def wait(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_etcd_unreachable_at_start_is_one_line_and_exit_2(tmp_path: Path) -> None:
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "elasticd.cli", "start", "--rdzv-backend", "etcd", "--rdzv-endpoint",
                          f"127.0.0.1:{port}", "--nnodes", "1:2", "--no-zygote", str(TICKER)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={**os.environ, "ELASTICD_RUNTIME_DIR": str(tmp_path / "run")})
    assert out.returncode == 2
    assert f"no etcd endpoint answered (127.0.0.1:{port})" in out.stderr and "Traceback" not in out.stderr


def test_without_the_client_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "etcd3gw", None)  # as if etcd3gw were not installed
    with pytest.raises(ImportError, match=r"pip install 'elastic\[etcd\]'"):
        EtcdClient([("127.0.0.1", 2379)])


def test_a_quiet_job_writes_nothing_to_etcd_and_a_change_writes_only_itself(etcd: EtcdCluster) -> None:
    """Heartbeats never reach etcd: with nothing changed, a sync has nothing to write."""
    store, _prefix = etcd_store(etcd, history=3)
    store.job_state = lambda: {"target": 2}
    for seq, node_id in enumerate("ab", 1):
        store.put_node(node(node_id, seq))
    for round_id in range(1, 6):
        store.put_round(round_of(round_id, ["a", "b"]))
    store.nodes()["a"].last_seen = 12345.0  # what a heartbeat changes
    store.nodes()["a"].metrics = {"0": {"step": 7}}
    assert store.changes() == []
    store.nodes()["b"].role = Role.draining
    assert [op["request_put"]["key"] for op in store.changes()] == [b64(f"{store.prefix}state/nodes/b")]


def test_a_sync_encodes_only_what_changed_and_a_restart_or_a_timeline_still_reaches_etcd(
        etcd: EtcdCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every 0.1 s: at 2,048 nodes, encoding every record each time cost a quarter of a core."""
    store, prefix = etcd_store(etcd, history=3)
    cfg = JobConfig(2, 2, 2, "127.0.0.1", 29400, "job", "a", ["train.py"])
    c = Coordinator(cfg, store, lambda *_: None, EventLog(), lambda _e: None)
    store.job_state = lambda: {"target": 2}
    for node_id in "ab":
        c.registration.register(node_id, Register(f"i-{node_id}", "10.0.0.1", 2, ports=[29500, 29501]), 1.0)
    c.start_round(Cause.start, "test", 1.0, 1.0)
    store.sync()
    encoded: list[str] = []
    value = EtcdStore.node_value
    monkeypatch.setattr(EtcdStore, "node_value", staticmethod(lambda n: encoded.append(n.node_id) or value(n)))
    assert store.changes() == [] and encoded == []  # a quiet job: no record encoded, nothing written
    c.start_round(Cause.failure, "a worker failed", 2.0, 2.0)  # both nodes' restarts move (in place, before)
    c.tracker.round_progress("a", ProgressReport(2, stopped=2.1))
    store.sync()
    c.tracker.round_progress("b", ProgressReport(2, stopped=2.2))  # the round's timeline moves on
    assert [op["request_put"]["key"] for op in store.changes()] == [b64(f"{prefix}state/rounds/0000000002")]
    snap = Snapshot.read(client_of(etcd), prefix)  # what a new coordinator would rebuild from
    assert {n: r.restarts[Cause.failure] for n, r in snap.nodes.items()} == {"a": 1, "b": 1}
