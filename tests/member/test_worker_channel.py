"""The daemon's worker channel on a real socket: each frame decoded once into its record; a malformed one dropped,
counted and said, while the channel goes on serving that worker and acting on its well-formed frames."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
import zmq
import zmq.asyncio

import elasticd.member.in_place as in_place_module
from elasticd.commands.event_text import describe
from elasticd.job.config import JobConfig
from elasticd.member.in_place import InPlace
from elasticd.member.rank_reports import RankReports
from elasticd.member.worker_channel import WorkerChannel
from elasticd.wire.assignment import WorkerRequest
from elasticd.wire.diagnosis import StackDump, main_thread_where
from elasticd.wire.names import EventKind, MeshOp, NodeState, WorkerOp
from elasticd.wire.protocol import decode
from elasticd.wire.worker_reports import RankStep

pytestmark = pytest.mark.quick  # threads and sockets, no process: `make quick`

PID = 4242  # the worker's, as its hello says (no such process is signalled: nothing here aborts)


class Node:
    """What the worker channel and InPlace use of the node agent, recorded."""

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg, self.round_id, self.state = cfg, 4, NodeState.running
        self.group: Any = None
        self.drained_ranks: set[int] = set()
        self.worker_env: dict[str, str] = {}
        self.spawner: Any = None
        self.rank_reports = RankReports()
        self.in_place = InPlace(self)
        self.steps: list[RankStep] = []
        self.events: list[tuple[EventKind, dict[str, Any]]] = []
        self.failures: list[str] = []
        self.sent: list[tuple[MeshOp, dict[str, Any]]] = []

    def step_reported(self, step: RankStep, _now: float) -> None:
        self.steps.append(step)

    def event(self, kind: EventKind, **fields: Any) -> None:
        self.events.append((kind, fields))

    def report_failure(self, _worker: object, reason: str, hang: bool = False) -> None:
        self.failures.append(reason)

    def to_coord(self, op: MeshOp, body: dict[str, Any]) -> None:
        self.sent.append((op, body))

    def check_drained(self) -> None: ...
    def on_worker_exit(self, _worker: object) -> None: ...
    def pre_started(self, _group: object) -> None: ...

    async def dump_stacks(self, worker: Any) -> StackDump:
        text = 'Current thread 0x1 (most recent call first):\n  File "train.py", line 12 in step\n'
        return StackDump(worker.rank, worker.proc.pid, main_thread_where(text), text)


@dataclass
class Channel:
    node: Node
    channel: WorkerChannel
    worker: zmq.asyncio.Socket
    serving: asyncio.Task[None]
    seq: list[int] = field(default_factory=lambda: [0])

    async def send(self, op: str, body: object) -> None:
        self.seq[0] += 1
        await self.worker.send(json.dumps({"v": 1, "type": "ev", "op": op, "id": f"w{self.seq[0]}",
                                           "body": body}).encode())

    async def until(self, done: Any) -> None:
        for _ in range(500):
            if done():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the channel did not get there in 5 s")

    async def answers(self) -> list[tuple[str, dict[str, Any]]]:
        """What the channel sent this worker so far."""
        got = []
        while await self.worker.poll(200):
            env = decode(await self.worker.recv())
            got.append((env.op, env.body))
        return got


@pytest_asyncio.fixture
async def live() -> AsyncIterator[Channel]:
    cfg = JobConfig(1, 1, 1, "127.0.0.1", 1, f"wc-{uuid.uuid4().hex[:8]}", "a", ["train.py"])
    ctx = zmq.asyncio.Context()
    node = Node(cfg)
    channel = WorkerChannel(ctx, cfg, node)  # type: ignore[arg-type]
    addr = channel.bind()["ELASTICD_WORKER_ADDR"]
    serving = asyncio.create_task(channel.serve())
    worker = ctx.socket(zmq.DEALER)
    worker.setsockopt(zmq.LINGER, 0)
    worker.connect(addr)
    try:
        yield Channel(node, channel, worker, serving)
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        worker.close()
        channel.close()
        ctx.destroy(linger=0)


HELLO = {"rank": 3, "local_rank": 0, "pid": PID, "round": 4, "in_place": True, "waiting": False, "welcome": True,
         "abort_signal": 12}


@pytest.mark.asyncio
async def test_malformed_hello_left_and_joined_are_dropped_and_the_worker_still_served(
        live: Channel, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="elasticd")
    await live.send(WorkerOp.hello, {**HELLO, "rank": "3"})
    await live.send(WorkerOp.hello, {**HELLO, "rank": "4"})  # the same fault again: said once a minute, no more
    await live.send(WorkerOp.hello, {**HELLO, "in_place": 1})  # once `False`; now refused
    await live.send(WorkerOp.left, {"rank": 3, "round": 4, "step": 7, "error": "boom"})
    await live.send(WorkerOp.joined, {"rank": 3, "pid": PID, "round": 4, "heal": "all of it"})
    await live.send(WorkerOp.resize_failed, {"rank": 3, "pid": str(PID), "round": 5})
    await live.send(WorkerOp.resize_failed, [3, PID])  # not even an envelope's body: refused before any record
    await live.send(WorkerOp.hello, {**HELLO, "abort_signal": 2**70})
    await live.worker.send(b"not json at all")
    await live.send(WorkerOp.hello, HELLO)
    await live.send(WorkerOp.step, {"rank": 3, "step": 1, "loss": 0.5})
    await live.until(lambda: live.node.steps)
    assert live.channel.dropped_frames == 9
    assert [(op, body) for op, body in await live.answers()] == [(WorkerOp.welcome, {"hold": False})]  # no error
    assert live.channel.idents[3][1] == 4 and live.node.in_place.capable == {PID}
    assert live.node.in_place.abort_signals == {PID: 12} and live.node.steps[0].loss == 0.5
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == ["[a] worker channel: dropped a malformed hello: hello: field 'rank' must be int, got str",
                      "[a] worker channel: dropped a malformed hello: hello: field 'in_place' must be bool, got int",
                      "[a] worker channel: dropped a malformed left: left: field 'pid' is missing",
                      "[a] worker channel: dropped a malformed joined: joined: field 'heal' must be object or null, "
                      "got str",
                      "[a] worker channel: dropped a malformed resize_failed: resize_failed: field 'pid' must be "
                      "int, got str",
                      "[a] worker channel: dropped a bad frame: field 'body' must be an object",
                      "[a] worker channel: dropped a bad frame: not valid JSON: integer 11805916207174113034 is "
                      "out of range",
                      "[a] worker channel: dropped a bad frame: not valid JSON: Expecting value: line 1 column 1 "
                      "(char 0)"]
    assert live.node.events == [] and live.node.failures == [] and live.node.sent == []


@pytest.mark.asyncio
async def test_left_joined_and_resize_failed_reach_the_in_place_round_as_records(live: Channel) -> None:
    node = live.node
    await live.send(WorkerOp.hello, HELLO)
    await live.until(lambda: PID in node.in_place.capable)
    await live.send(WorkerOp.left, {"rank": 3, "pid": PID, "round": 4, "step": 7, "request_id": None,
                                    "error": "NCCL communicator was aborted"})
    await live.until(lambda: node.failures)
    assert node.events == [(EventKind.worker_left, {"round": 4, "rank": 3, "pid": PID, "step": 7,
                                                    "error": "NCCL communicator was aborted"})]
    assert node.failures == ["worker rank 3 on node a lost its process group at step 7: NCCL communicator was aborted"]
    node.group = SimpleNamespace(round_id=5, workers=[SimpleNamespace(proc=SimpleNamespace(pid=PID))])
    heal = {"received_bytes": 4096, "sent_bytes": 0, "senders": 2, "seconds": 0.41, "plan_s": 0.01, "transfer_s": 0.4,
            "fallback": None, "prepared_bytes": 1024}
    await live.send(WorkerOp.joined, {"rank": 2, "pid": PID, "round": 4, "step": 7, "in_place": True})  # an old one
    await live.send(WorkerOp.joined, {"rank": 2, "pid": PID, "round": 5, "step": 7, "in_place": True,
                                      "last_step_at": 10.0, "group_ready": 10.5, "synced": 11.0, "rebuild_s": 0.27,
                                      "collect_s": 0.02, "heal": heal})
    await live.send(WorkerOp.resize_failed, {"rank": 2, "pid": PID, "round": 6, "reason": "the store timed out"})
    await live.until(lambda: len(node.sent) == 2)
    assert node.sent == [(MeshOp.round_progress, {"round": 5, "in_place": True, "group_ready": 10.5, "synced": 11.0,
                                                  "rebuild_s": 0.27, "collect_s": 0.02, "last_step_at": 10.0,
                                                  "events": [],
                                                  "heal": {"received_bytes": 4096, "sent_bytes": 0, "senders": 2,
                                                           "seconds": 0.41, "plan_s": 0.01, "transfer_s": 0.4,
                                                           "fallback": None, "prepared_bytes": 1024}}),
                         (MeshOp.resize_failed, {"round": 6, "reason": "rank 2 on node a: the store timed out"})]
    assert PID not in node.in_place.capable and live.channel.dropped_frames == 0


@pytest.mark.asyncio
async def test_a_nodes_progress_carries_the_phases_of_its_last_rank_to_join(live: Channel) -> None:
    """The stall ends with the last rank to hold the freshest state: its phases go on, so that the parts add up;
    the heal's bytes are every rank's."""
    node = live.node
    node.group = SimpleNamespace(round_id=5, workers=[SimpleNamespace(proc=SimpleNamespace(pid=p))
                                                      for p in (PID, PID + 1)])
    heal = {"received_bytes": 4096, "sent_bytes": 0, "senders": 1, "seconds": 0.3, "plan_s": 0.1,
            "transfer_s": 0.2, "fallback": None, "prepared_bytes": 1024}
    await live.send(WorkerOp.joined, {"rank": 2, "pid": PID + 1, "round": 5, "step": 7, "in_place": True,
                                      "last_step_at": 10.0, "group_ready": 10.6, "synced": 11.4, "rebuild_s": 0.2,
                                      "state_s": 0.1, "wait_s": 0.05, "restore_s": 0.1, "heal": heal})
    await live.send(WorkerOp.joined, {"rank": 3, "pid": PID, "round": 5, "step": 7, "in_place": True,
                                      "last_step_at": 10.1, "group_ready": 10.5, "synced": 11.0, "rebuild_s": 0.4,
                                      "state_s": 0.2, "heal": {**heal, "seconds": 0.5, "transfer_s": 0.4}})
    await live.until(lambda: len(node.sent) == 1)
    assert node.sent == [(MeshOp.round_progress, {
        "round": 5, "in_place": True, "group_ready": 10.6, "synced": 11.4, "rebuild_s": 0.2, "state_s": 0.1,
        "wait_s": 0.05, "restore_s": 0.1, "last_step_at": 10.0, "events": [],
        "heal": {"received_bytes": 8192, "sent_bytes": 0, "senders": 2, "seconds": 0.3, "plan_s": 0.1,
                 "transfer_s": 0.2, "fallback": None, "prepared_bytes": 2048}})]


@pytest.mark.asyncio
async def test_requests_go_out_as_their_records_encode(live: Channel) -> None:
    await live.send(WorkerOp.hello, {**HELLO, "welcome": False})
    await live.until(lambda: 3 in live.channel.idents)
    assert live.channel.request(WorkerOp.drain, WorkerRequest("d1", 40)) == 1
    assert live.channel.request(WorkerOp.checkpoint, WorkerRequest("", None)) == 1  # no id: the channel gives one
    got = await live.answers()
    assert got[0] == (WorkerOp.drain, {"request_id": "d1", "at_step": 40})
    assert got[1][0] == WorkerOp.checkpoint and got[1][1]["request_id"] and got[1][1]["at_step"] is None
    await live.send(WorkerOp.hello, {**HELLO, "rank": 4, "pid": PID + 1})  # late to the round: its drain, held not
    assert await live.answers() == [(WorkerOp.drain, {"request_id": "d1", "at_step": 40}),
                                    (WorkerOp.welcome, {"hold": False})]


@pytest.mark.asyncio
async def test_a_kept_worker_that_never_leaves_its_group_is_replaced_saying_where_it_was_stuck(
        live: Channel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A survivor that does not say `left` in time is not kept (a new process takes its rank); before that, its
    stack is taken and the event says where it was blocked: the reason a crash cost a restart of that rank."""
    node = live.node
    monkeypatch.setattr(in_place_module, "LEAVE_SLACK_S", 0.05)
    node.cfg = replace(node.cfg, grace_s=0.0)
    released: list[Any] = []
    stuck = SimpleNamespace(proc=SimpleNamespace(pid=PID), rank=2, exit_code=None)
    node.group = SimpleNamespace(running=[stuck], release=released.extend)
    node.in_place.capable.add(PID)
    assert await node.in_place.keep(5) == [] and released == []
    (kind, fields), = node.events
    assert kind == EventKind.worker_not_left and fields["rank"] == 2 and fields["pid"] == PID
    assert fields["stack"]["where"].startswith("train.py:12")
    text = describe({"kind": kind, **fields})
    assert "rank 2 did not leave its group within" in text and "blocked at train.py:12" in text, text
