"""The worker channel's records: a real shim's frames decode into FROM_WORKER's, the daemon's TO_WORKER frames are
read by the shim as meant, and a malformed body is refused with the op and the field named."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from support.malformed import refused, required

from elasticd.wire.names import WorkerOp
from elasticd.wire.protocol import Envelope, decode, encode
from elasticd.wire.record import Record
from elasticd.wire.worker_reports import BETWEEN_ROUNDS, FROM_WORKER, Hello, Joined
from elasticd.wire.worker_requests import TO_WORKER, AtStep, Generation, Resize, WorkerWelcome
from trainer_shim import Request, Session
from trainer_shim.generation import Generation as ShimGeneration
from trainer_shim.heal import Healed
from trainer_shim.phases import COLLECT, REBUILD, RESTORE, STATE, WAIT, Phases

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

# One body per op typed here, as trainer_shim sends it (docs/worker-channel.md)...
FROM_SHIM: dict[str, dict[str, Any]] = {
    WorkerOp.hello: {"rank": 3, "local_rank": 1, "pid": 4242, "round": 5, "in_place": True, "waiting": False,
                     "welcome": True, "abort_signal": 12},
    WorkerOp.left: {"rank": 3, "pid": 4242, "round": 5, "step": 120, "request_id": None,
                    "error": "NCCL communicator was aborted"},
    WorkerOp.joined: {"rank": 2, "pid": 4242, "round": 6, "step": 120, "in_place": True, "last_step_at": 1795841441.25,
                      "group_ready": 1795841441.5, "synced": 1795841442.25, "rebuild_s": 0.27,
                      "heal": {"received_bytes": 4096, "sent_bytes": 0, "senders": 2, "seconds": 0.41, "plan_s": 0.01,
                               "transfer_s": 0.4, "fallback": None, "prepared_bytes": 1024}},
    WorkerOp.resize_failed: {"rank": 2, "pid": 4242, "round": 6, "reason": "the generation's store did not answer"},
}
# ...and as the daemon sends it.
FROM_DAEMON: dict[str, dict[str, Any]] = {
    WorkerOp.checkpoint: {"request_id": "c1", "at_step": 40},
    WorkerOp.drain: {"request_id": "d1", "at_step": None},
    WorkerOp.resize: {"request_id": "r1", "at_step": None, "round": 6},
    WorkerOp.generation: {"round": 6, "rank": 2, "world_size": 4, "local_rank": 0, "group_rank": 1,
                          "group_world_size": 2, "store": "10.0.0.1:29400", "prefix": "elastic/job/g6"},
    WorkerOp.welcome: {"hold": False},
}
RECORDS: dict[str, type[Record]] = {**{f"worker.{op}": FROM_WORKER[op] for op in FROM_SHIM},
                                    **{f"daemon.{op}": r for op, r in TO_WORKER.items()}}
SENT = {**{f"worker.{op}": b for op, b in FROM_SHIM.items()}, **{f"daemon.{op}": b for op, b in FROM_DAEMON.items()}}


@pytest.fixture
def router() -> Iterator[tuple[str, zmq.Socket]]:
    d = tempfile.mkdtemp(prefix="wrec", dir="/tmp")  # ipc paths must stay under ~100 bytes
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"ipc://{d}/w.sock")
    yield f"ipc://{d}/w.sock", sock
    sock.close()
    ctx.term()
    shutil.rmtree(d, ignore_errors=True)


def recv(sock: zmq.Socket) -> tuple[bytes, Envelope]:
    assert sock.poll(5000), "no frame from the shim in time"
    ident, payload = sock.recv_multipart()
    return ident, decode(payload)


def send(sock: zmq.Socket, ident: bytes, op: WorkerOp, record: Record) -> None:
    sock.send_multipart([ident, encode(Envelope("req", op, record.encode(), id=f"x-{op}"))])


def names(record: type[Record]) -> set[str]:
    return {f.name for f in dataclasses.fields(record)}  # type: ignore[arg-type]


def test_every_op_either_way_has_a_record_and_a_sample() -> None:
    assert set(FROM_WORKER) == {*FROM_SHIM, WorkerOp.step, WorkerOp.checkpoint, WorkerOp.checkpoint_skipped,
                                WorkerOp.ack, WorkerOp.drained}  # the last five: tests/wire/test_records.py
    assert set(TO_WORKER) == set(FROM_DAEMON) and set(FROM_WORKER) | set(TO_WORKER) == set(WorkerOp)


def test_a_real_shims_frames_decode_into_their_records(router: tuple[str, zmq.Socket]) -> None:
    """Every key trainer_shim writes is a field of the op's record (none ignored), and every field is written."""
    addr, sock = router
    healed = Healed(step=120, source=0, skeleton=None, received_bytes=4096, senders=2, seconds=0.41, plan_s=0.01,
                    transfer_s=0.4)
    heal = healed.report("rows of 1 tensors are held by no live rank")  # what a `joined` carries
    phases = Phases()  # every phase a change times, by the names the shim reports them under
    for name, seconds in ((REBUILD, 0.27), (STATE, 0.1), (WAIT, 0.05), (COLLECT, 0.02), (RESTORE, 0.03)):
        phases.add(name, seconds)
    with Session(addr, rank=3, local_rank=1, node="n1", round_id=5) as s:
        s.abort_signal = int(signal.SIGUSR2)
        s.rejoin(3, 0, in_place=True, waiting=True, welcome=True)  # a pre-started worker's first hello
        s.left(120, "r1")
        s.left(120, None, "NCCL communicator was aborted")
        s.joined(6, 120, True, {"started": 1.5, "last_step_at": 2.0, "group_ready": 2.5, "synced": 3.5,
                                **phases.report()}, heal)
        s.joined(7, 121, True, {"group_ready": 4.5, "synced": 5.5})  # a heal that moved nothing is not reported
        s.resize_failed(8, "RuntimeError: the generation's store did not answer")
        frames = [recv(sock)[1] for _ in range(7)]
    sent: dict[str, set[str]] = {}
    for env in frames:
        record = FROM_WORKER[env.op].decode(env.body, env.op)
        assert set(env.body) <= names(FROM_WORKER[env.op]), env.op
        assert {k: v for k, v in record.encode().items() if k in env.body} == env.body
        sent.setdefault(env.op, set()).update(env.body)
    assert {op: names(FROM_WORKER[op]) - keys for op, keys in sent.items()} == \
        {WorkerOp.hello: set(), WorkerOp.left: set(), WorkerOp.joined: set(), WorkerOp.resize_failed: set()}
    first, again = (Hello.decode(f.body) for f in frames[:2])
    assert (first.rank, first.local_rank, first.pid, first.round, first.in_place, first.waiting, first.welcome,
            first.abort_signal) == (3, 1, os.getpid(), 5, False, False, False, None)
    assert (again.round, again.in_place, again.waiting, again.welcome, again.abort_signal) == \
        (0, True, True, True, signal.SIGUSR2)
    joined = Joined.decode(frames[4].body)
    assert joined.heal is not None and (joined.heal.received_bytes, joined.heal.senders, joined.heal.fallback) == \
        (4096, 2, "rows of 1 tensors are held by no live rank")
    assert (joined.rebuild_s, joined.heal.plan_s, joined.heal.transfer_s) == (0.27, 0.01, 0.4)
    assert (joined.state_s, joined.wait_s, joined.collect_s, joined.restore_s) == (0.1, 0.05, 0.02, 0.03)
    assert Joined.decode(frames[5].body).heal is None


def test_the_shim_reads_the_daemons_requests_as_meant(router: tuple[str, zmq.Socket]) -> None:
    addr, sock = router
    with Session(addr, rank=2, round_id=5) as s:
        ident, _ = recv(sock)
        send(sock, ident, WorkerOp.checkpoint, AtStep("c1", 40))
        send(sock, ident, WorkerOp.drain, AtStep("d1"))
        send(sock, ident, WorkerOp.resize, Resize("r1", None, round=6))
        generation = Generation(6, 2, 4, 0, 1, 2, "10.0.0.1:29400", "elastic/job/g6")
        send(sock, ident, WorkerOp.generation, generation)
        body = s.wait_generation(5, 5.0)
        assert s.pending == [Request("checkpoint", "c1", 40), Request("drain", "d1", None),
                             Request("resize", "r1", None, 6)]
    assert body is not None
    assert ShimGeneration.from_body(body) == ShimGeneration(6, 2, 4, "10.0.0.1:29400", "elastic/job/g6")


def test_a_welcome_lets_the_shims_first_step_go(router: tuple[str, zmq.Socket]) -> None:
    """The shim waits up to 2 s for its welcome; `hold: false` ends the wait at once."""
    addr, sock = router

    def daemon() -> None:
        ident, hello = recv(sock)
        assert Hello.decode(hello.body).welcome
        send(sock, ident, WorkerOp.welcome, WorkerWelcome(hold=False))

    answering = threading.Thread(target=daemon)
    answering.start()
    start = time.monotonic()
    with Session(addr, rank=0, welcome=True):
        waited = time.monotonic() - start
    answering.join(5)
    assert waited < 1.5


@pytest.mark.parametrize("op", sorted(SENT))
def test_a_sent_body_decodes_and_encodes_back_as_sent(op: str) -> None:
    record = RECORDS[op].decode(SENT[op], op)
    assert record.encode() == {**record.encode(), **SENT[op]}
    assert RECORDS[op].decode(record.encode(), op) == record


def refusal(op: str, body: object) -> str:
    return refused(RECORDS[op], op, body)


@pytest.mark.parametrize("op", sorted(SENT))
def test_each_kind_of_malformed_body_is_refused_with_the_field_named(op: str) -> None:
    for body in ([SENT[op]], None, "hello", 3):
        assert "body must be an object, got" in refusal(op, body)
    for name in required(RECORDS[op]):
        assert f"field '{name}' is missing" in refusal(op, {k: v for k, v in SENT[op].items() if k != name})
    for name, value in SENT[op].items():
        wrong: Any = {} if not isinstance(value, dict) else "text"
        assert f"field '{name}' must be" in refusal(op, {**SENT[op], name: wrong})
        if isinstance(value, int) and not isinstance(value, bool):
            assert f"field '{name}' is out of range" in refusal(op, {**SENT[op], name: 2**70})


def test_a_rank_as_text_a_flag_as_a_number_and_a_bad_heal_are_refused() -> None:
    """What `int(body["rank"])` and `body.get("in_place") is True` let through or took for false, said now."""
    hello, joined = SENT["worker.hello"], SENT["worker.joined"]
    assert "field 'rank' must be int, got str" in refusal("worker.hello", {**hello, "rank": "3"})
    assert "field 'in_place' must be bool, got int" in refusal("worker.hello", {**hello, "in_place": 1})
    assert "field 'heal.senders' must be int, got list" in \
        refusal("worker.joined", {**joined, "heal": {**joined["heal"], "senders": [0, 1]}})
    assert "abort_signal 0 is not a signal number" in refusal("worker.hello", {**hello, "abort_signal": 0})
    assert "abort_signal 4096 is not a signal number" in refusal("worker.hello", {**hello, "abort_signal": 4096})


def test_defaults_are_what_the_handlers_read_before() -> None:
    """A hello with only a rank: the daemon's current round (None here), pid 0, no flags, no abort signal."""
    assert Hello.decode({"rank": 0}) == Hello(0, 0, 0, None, False, False, False, None)
    for op, record in BETWEEN_ROUNDS.items():
        assert required(record) == (["rank", "pid", "round"] if op == WorkerOp.joined else ["rank", "pid"])

