"""The shim's channel against a real ROUTER standing in for the daemon, and the quiet no-op mode."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist
import zmq

import trainer_shim
import trainer_shim.session as session_module
from elasticd.wire.protocol import Envelope, decode, encode
from elasticd.wire.worker_reports import RankStep
from elasticd.wire.worker_requests import Resize
from trainer_shim import NullSession, Session
from trainer_shim.step_fence import StepFence

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`


@pytest.fixture
def addr() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="shim", dir="/tmp")  # ipc paths must stay under ~100 bytes
    yield f"ipc://{d}/w.sock"
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def router(addr: str) -> Iterator[zmq.Socket]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(addr)
    yield sock
    sock.close()
    ctx.term()


def recv(sock: zmq.Socket, timeout_ms: int = 5000) -> tuple[bytes, Envelope]:
    assert sock.poll(timeout_ms), "no frame from the shim in time"
    ident, payload = sock.recv_multipart()
    return ident, decode(payload)


def request(sock: zmq.Socket, ident: bytes, op: str, rid: str, at_step: int | None, **body: int) -> None:
    env = Envelope(type="req", op=op, body={"request_id": rid, "at_step": at_step, **body}, id=rid)
    sock.send_multipart([ident, encode(env)])


def wait_for(pred, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.001)


def test_noop_without_addr() -> None:
    s = trainer_shim.init({"RANK": "2"})
    assert isinstance(s, NullSession) and not s.enabled and s.rank == 2
    s.report(1, loss=0.5, samples=8, acc=1.0)
    s.report_checkpoint(1, "p", 1, 0.1)
    s.drained(1)
    assert not s.should_checkpoint(1) and not s.should_stop(10**9) and s.pending == []
    s.close()


def test_hello_step_checkpoint_frames(addr: str, router: zmq.Socket) -> None:
    env = {"ELASTICD_WORKER_ADDR": addr, "RANK": "3", "LOCAL_RANK": "1", "ELASTICD_NODE_ID": "n1",
           "ELASTICD_ROUND": "4"}
    with trainer_shim.init(env) as s:
        assert isinstance(s, Session)
        s.report(7, loss=float("nan"), samples=32, tokens=640, lr=0.1, **{'odd "name"': float("inf")})
        s.report_checkpoint(7, "/ck/ckpt-00000007.pt", 1234, 0.5, "rq")
        s.report_skipped("/ck/bad.pt", "sha256 mismatch")
        _, hello = recv(router)
        assert (hello.type, hello.op, hello.node) == ("ev", "hello", "n1")
        assert hello.body == {"rank": 3, "local_rank": 1, "pid": os.getpid(), "round": 4, "in_place": False,
                              "waiting": False}
        _, step = recv(router)
        assert step.op == "step" and step.seq == hello.seq + 1
        body = step.body
        assert body["rank"] == 3 and body["step"] == 7 and body["loss"] is None and body["samples"] == 32
        assert body["tokens"] == 640 and body["metrics"] == {"lr": 0.1, 'odd "name"': None} and body["dropped"] == 0
        assert body["step_time"] >= 0
        # The frame the shim writes by hand is the daemon's RankStep, field for field: one definition, both ends.
        read = RankStep.decode(body, "step")
        assert set(body) == {f.name for f in dataclasses.fields(RankStep)} and read.encode() == body
        _, ck = recv(router)
        assert ck.op == "checkpoint" and ck.body == {"rank": 3, "step": 7, "path": "/ck/ckpt-00000007.pt",
                                                     "bytes": 1234, "duration_s": 0.5, "request_id": "rq"}
        _, sk = recv(router)
        assert sk.op == "checkpoint_skipped" and sk.body["reason"] == "sha256 mismatch"


def test_requests_honoured_at_step(addr: str, router: zmq.Socket) -> None:
    with Session(addr, rank=0) as s:
        ident, _ = recv(router)  # hello
        request(router, ident, "checkpoint", "c1", 5)
        request(router, ident, "drain", "d1", 8)
        wait_for(lambda: (s.poll(), len(s.pending) == 2)[1])
        acks = [recv(router)[1] for _ in range(2)]
        assert [(a.op, a.body["request_id"], a.body["op"]) for a in acks] == [("ack", "c1", "checkpoint"),
                                                                           ("ack", "d1", "drain")]
        request(router, ident, "checkpoint", "c1", 5)  # a resend is not a second request
        ck_steps, stop_step = [], None
        for step in range(1, 20):
            if s.should_checkpoint(step):
                ck_steps.append((step, s.last_request_id))
            if s.should_stop(step):
                stop_step = step
                s.drained(step)
                break
        assert ck_steps == [(5, "c1")] and stop_step == 8
        _, drained = recv(router)
        assert drained.op == "drained" and drained.body == {"rank": 0, "step": 8, "request_id": "d1"}


def test_null_at_step_means_next_boundary(addr: str, router: zmq.Socket) -> None:
    with Session(addr) as s:
        ident, _ = recv(router)
        assert not s.should_checkpoint(3)
        request(router, ident, "checkpoint", "now", None)
        wait_for(lambda: (s.poll(), bool(s.pending))[1])
        assert s.should_checkpoint(4) and not s.should_checkpoint(5)


def test_a_resize_that_crossed_the_ranks_own_leave_is_not_acted_on(addr: str, router: zmq.Socket) -> None:
    """A rank that left its group on a peer's crash must not leave the next generation for the daemon's late
    `resize` (sent before the daemon saw its `left`): its new peers would fail with "connection closed"."""
    with Session(addr, rank=1, round_id=6) as s:
        ident, _ = recv(router)
        request(router, ident, "resize", "graceful", 150)  # an agreed step the crash came before
        wait_for(lambda: (s.poll(), len(s.pending) == 1)[1])
        s.left_group()  # it left on the collective error
        assert s.pending == []
        request(router, ident, "resize", "late", None, round=7)  # the daemon's "leave now" for generation 7
        wait_for(lambda: (s.poll(), len(s.pending) == 1)[1])
        s.rejoin(1, 7, in_place=True)  # it joined generation 7 anyway
        assert not s.should_resize(150) and s.pending == []
        request(router, ident, "resize", "next", None, round=8)  # the next change is honoured
        wait_for(lambda: (s.poll(), len(s.pending) == 1)[1])
        assert s.should_resize(151) and s.last_request_id == "next"



def test_a_resize_says_whether_every_rank_stays_as_the_daemon_encodes_it(addr: str, router: zmq.Socket) -> None:
    """A join's `resize` (every rank stays) and a drain's, as the daemon's `Resize` record writes them: the rank
    acting on one knows which it is (a sharded rank gathers its shards with no replica only for the second)."""
    with Session(addr, rank=0, round_id=3) as s:
        ident, _ = recv(router)
        for rid, all_stay, at in (("join", True, 10), ("drain", False, 20)):
            body = Resize(rid, at, all_stay=all_stay).encode()
            router.send_multipart([ident, encode(Envelope(type="req", op="resize", body=body, id=rid))])
            wait_for(lambda: (s.poll(), len(s.pending) == 1)[1])
            assert s.should_resize(at) and s.last_request is not None
            assert (s.last_request_id, s.last_request.all_stay) == (rid, all_stay)
            s.left_group()


def two_ranks(addr: str, router: zmq.Socket) -> tuple[list[Session], list[bytes]]:
    """Two in-place ranks of one generation on the fake daemon, each with the job store's fence."""
    ranks = [Session(addr, rank=r) for r in (0, 1)]
    idents: dict[int, bytes] = {}
    for _ in ranks:
        ident, hello = recv(router)
        idents[hello.body["rank"]] = ident
    return ranks, [idents[0], idents[1]]


def boundary(ranks: list[Session], fence: StepFence, step: int) -> list[bool]:
    """Both ranks at one step boundary, as trainer_shim.Elastic passes it: settle, then whether to resize."""
    due = []
    for s in ranks:
        s.agree(step, fence)
        due.append(s.should_resize(step))
    return due


def heard(s: Session, count: int = 1) -> None:
    wait_for(lambda: (s.poll(), len(s.pending) == count)[1])


def test_a_rank_that_hears_of_a_resize_after_its_step_leaves_with_the_others(addr: str, router: zmq.Socket) -> None:
    """Rank 1's copy of a resize for step 5 is still on its way when both reach step 5: rank 0 acts there,
    so rank 1 waits for its copy and acts there too, rather than training step 6 alone (a collective that
    would pair with rank 0's leaving, and hang or mix their states)."""
    fence = StepFence(dist.HashStore(), "gen-3")
    ranks, idents = two_ranks(addr, router)
    try:
        request(router, idents[0], "resize", "r", 5)
        heard(ranks[0])
        assert boundary(ranks, fence, 3) == [False, False] and boundary(ranks, fence, 4) == [False, False]
        ranks[0].agree(5, fence)
        late = threading.Thread(target=ranks[1].agree, args=(5, fence))
        late.start()
        time.sleep(0.3)
        assert late.is_alive(), "rank 1 went on to step 6 without its copy"
        request(router, idents[1], "resize", "r", 5)
        late.join(5)
        assert not late.is_alive() and [s.should_resize(5) for s in ranks] == [True, True]
    finally:
        for s in ranks:
            s.close()


def test_a_resize_every_rank_hears_too_late_acts_at_one_boundary(addr: str, router: zmq.Socket) -> None:
    """Both copies come after their step 2, at different boundaries: the first to hear moves it to its next
    boundary, and the other, hearing there, acts there too."""
    fence = StepFence(dist.HashStore(), "gen-3")
    ranks, idents = two_ranks(addr, router)
    try:
        request(router, idents[0], "resize", "r", 2)
        heard(ranks[0])
        assert boundary(ranks, fence, 4) == [False, False]
        request(router, idents[1], "resize", "r", 2)
        heard(ranks[1])
        assert boundary(ranks, fence, 5) == [True, True]
    finally:
        for s in ranks:
            s.close()


def test_a_rank_whose_copy_never_comes_stops_with_a_reason(addr: str, router: zmq.Socket) -> None:
    fence = StepFence(dist.HashStore(), "gen-3")
    fence.mark(7)  # another rank acts at step 7
    with Session(addr, rank=1) as s:
        recv(router)
        with pytest.raises(SystemExit, match="another rank acts on a request at step 7, and none reached"):
            s.agree(7, fence, wait_s=0.3)


def test_report_never_blocks_without_daemon(addr: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTICD_REPORT_INTERVAL", "0")  # a frame per report, to count every one
    with Session(addr) as s:  # nobody bound: frames queue to SNDHWM, then count as drops
        start = time.perf_counter()
        for i in range(10_000):
            s.report(i, loss=1.0, samples=4)
            s.should_checkpoint(i)
        elapsed = time.perf_counter() - start
        assert elapsed < 5.0
        assert s.dropped > 0 and s.sent + s.dropped == 10_001


def test_daemon_gone_mid_run(addr: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTICD_REPORT_INTERVAL", "0")
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.LINGER, 0)
    r.bind(addr)
    with Session(addr) as s:
        recv(r)
        r.close()
        ctx.term()
        for i in range(5000):
            s.report(i)
            assert not s.should_stop(i)
        assert s.sent + s.dropped == 5001


def test_events_from_other_threads_are_queued(addr: str, router: zmq.Socket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTICD_REPORT_INTERVAL", "0")
    with Session(addr) as s:
        recv(router)
        def elsewhere() -> None:
            s.report_checkpoint(9, "/p", 1, 0.1, None)
            s.report(9)

        t = threading.Thread(target=elsewhere)
        t.start()
        t.join()
        assert not router.poll(50)  # nothing touched the socket off its owning thread
        s.report(10)  # the owning thread flushes the queued events first
        got = [recv(router)[1] for _ in range(3)]
        assert [(e.op, e.body.get("step")) for e in got] == [("checkpoint", 9), ("step", 9), ("step", 10)]


def test_reports_are_coalesced_but_lose_nothing_that_matters(addr: str, router: zmq.Socket) -> None:
    with Session(addr) as s:
        recv(router)  # hello
        for i in range(1, 2001):
            s.report(i, loss=1.0 / i, samples=4)
        first = recv(router)[1]
        assert first.body["step"] == 1 and first.body["samples"] == 4  # the first step goes out at once
        frames = [first]
    while router.poll(100):
        frames.append(recv(router)[1])
    steps = [f for f in frames if f.op == "step"]
    assert len(steps) < 200  # 2000 reports in a few ms: a handful of frames
    assert steps[-1].body["step"] == 2000  # close() flushed the latest step
    assert sum(f.body["samples"] for f in steps) == 4 * 2000  # samples are summed, never dropped


def test_malformed_requests_ignored(addr: str, router: zmq.Socket) -> None:
    with Session(addr) as s:
        ident, _ = recv(router)
        router.send_multipart([ident, b"not json"])
        router.send_multipart([ident, encode(Envelope(type="req", op="reboot", body={}))])
        request(router, ident, "drain", "d", 1)
        wait_for(lambda: (s.poll(), bool(s.pending))[1])
        assert [p.op for p in s.pending] == ["drain"]


def answer_hello(router: zmq.Socket, *replies: tuple[str, dict]) -> threading.Thread:
    """A daemon's worker channel: answers the first hello with these requests (a welcome last)."""
    def serve() -> None:
        ident, hello = recv(router)
        assert hello.op == "hello" and hello.body["welcome"] is True
        for op, body in replies:
            router.send_multipart([ident, encode(Envelope(type="req", op=op, body=body))])
    thread = threading.Thread(target=serve)
    thread.start()
    return thread


def test_a_first_hello_is_welcomed_with_the_drain_its_round_already_agreed(addr: str, router: zmq.Socket) -> None:
    server = answer_hello(router, ("drain", {"request_id": "d1", "at_step": 7}), ("welcome", {"hold": False}))
    with Session(addr, welcome=True) as s:
        server.join()
        assert [(r.op, r.at_step) for r in s.pending] == [("drain", 7)] and not s.should_stop(6) and s.should_stop(7)


def test_a_rank_whose_round_ends_without_it_is_held_before_its_first_step(addr: str, router: zmq.Socket,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "HOLD_S", 0.5)
    server = answer_hello(router, ("drain", {"request_id": "d1", "at_step": None}), ("welcome", {"hold": True}))
    began = time.monotonic()
    with Session(addr, welcome=True) as s:
        assert time.monotonic() - began >= 0.5  # held: a SIGTERM would have ended it (its daemon stops it)
        server.join()
        assert s.should_stop(1)  # never stopped: its drain applies at the first step


def test_a_daemon_that_does_not_answer_delays_the_start_by_at_most_the_welcome_wait(
        addr: str, router: zmq.Socket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "WELCOME_WAIT_S", 0.3)
    began = time.monotonic()
    with Session(addr, welcome=True) as s:
        assert 0.3 <= time.monotonic() - began < 2 and s.pending == []
