"""Every typed body, malformed in each way (tests/support/malformed.py: a field missing, of the wrong type, too big;
and an envelope of another protocol version), sent to live daemons on each of their sockets: the coordinator's mesh
(from a member it welcomed), a member's link (from its coordinator), the worker channel and the control socket.
Each is refused with the op and the field named, no traceback is printed, and the daemon goes on serving."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from support import malformed
from support.harness import PLAIN, DaemonProc, Job

from elasticd.commands.registry import REGISTRY
from elasticd.coordinator.inbox import RECORDS
from elasticd.job.runtime import id_digest
from elasticd.wire.assignment import TO_MEMBER
from elasticd.wire.names import MeshOp
from elasticd.wire.record import Record
from elasticd.wire.worker_reports import FROM_WORKER

ROGUE = "fz"


def frame(op: str, body: Any, node: str = "", kind: str = "req", v: int = 1) -> bytes:
    return json.dumps({"v": v, "type": kind, "op": op, "id": "m", "node": node, "seq": 0, "ts": time.time(),
                       "body": body}).encode()


def socket(kind: int, addr: str, identity: bytes = b"", bind: bool = False) -> zmq.Socket:
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if identity:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.bind(addr) if bind else sock.connect(addr)
    return sock


def refused_cases(table: dict[str, type[Record]]) -> Iterator[tuple[str, malformed.Case]]:
    """Every case a decoder must refuse (a field it does not know is taken: a newer peer may send more)."""
    for op, record in sorted(table.items()):
        yield from ((op, case) for case in malformed.cases(record) if case.kind != "extra")


def expected_line(op: str, case: malformed.Case, mesh: bool = True) -> str:
    """The refusal a case gets in the daemon's log: a number past 2**63 stops at the frame's JSON, 300 KB of text at
    the worker channel's frame cap (the mesh takes 64 MB frames), the rest at the op's record, which names the field."""
    if case.kind == "huge" and not isinstance(case.body[case.field], str):
        return r"dropped a bad frame.*: not valid JSON: integer \d+ is out of range"
    if case.kind == "huge" and not mesh:
        return r"dropped a bad frame: frame of \d+ bytes exceeds"
    return rf"malformed {re.escape(op)}\b.*{re.escape(op)}: field '{re.escape(case.field)}'"


def wait_lines(daemon: DaemonProc, start: int, expected: Counter[str], timeout: float = 20.0) -> None:
    """Each pattern appears at least as often as counted, in the daemon's output past line `start`."""
    deadline = time.monotonic() + timeout
    while True:
        lines = daemon.lines[start:]
        short = {p: n - sum(1 for line in lines if re.search(p, line)) for p, n in expected.items()}
        short = {p: n for p, n in short.items() if n > 0}
        if not short:
            break
        assert time.monotonic() < deadline, f"refusals not logged: {short}\n" + "\n".join(lines[-30:])
        time.sleep(0.2)
    assert "Traceback" not in "\n".join(daemon.lines), daemon.output()[-3000:]
    assert daemon.proc.poll() is None, daemon.output()[-3000:]


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    """One daemon holding the coordinator of a job that waits for 3 nodes: no worker runs, nothing moves."""
    with Job(tmp_path_factory.mktemp("malformed"), nnodes="3:3", nproc=1, extra=["--preload", "json"]) as job:
        job.start("a", PLAIN)
        yield job


def test_the_coordinator_refuses_each_malformed_member_message_by_name(coordinator: Job) -> None:
    a, instance = coordinator.daemon("a"), uuid.uuid4().hex[:12]
    rogue = socket(zmq.DEALER, f"tcp://127.0.0.1:{coordinator.port}", f"{ROGUE}|{instance}".encode())
    try:
        rogue.send(frame(MeshOp.register, {"node_id": ROGUE, "instance": instance, "host": "127.0.0.1", "nproc": 1,
                                           "ports": [1]}, ROGUE))
        assert rogue.poll(10_000), "no welcome"
        assert json.loads(rogue.recv())["body"]["ok"] is True  # a member now: its frames reach the decoders
        start, expected = len(a.lines), Counter[str]()
        for op, case in refused_cases(RECORDS):  # every op from a member
            rogue.send(frame(op, case.body, ROGUE))
            expected[expected_line(op, case)] += 1
        rogue.send(frame(MeshOp.leave, {}, ROGUE, v=2))
        expected[r"dropped a bad frame: protocol version 2 unsupported"] += 1
        wait_lines(a, start, expected)
    finally:
        rogue.close()
    status = coordinator.status()  # still waiting for a third node: no round, no restart
    assert (status["state"], status["round"] or None, sum(status["restarts"].values())) == ("waiting", None, 0)


def test_the_worker_channel_refuses_each_malformed_report_by_name(coordinator: Job) -> None:
    a = coordinator.daemon("a")
    digest = id_digest(f"{coordinator.job_id}--a")
    worker = socket(zmq.DEALER, f"ipc://{coordinator.tmp / 'run'}/w-{digest}-{a.proc.pid}.sock")
    try:
        start, expected = len(a.lines), Counter[str]()
        for op, case in refused_cases(FROM_WORKER):
            worker.send(frame(op, case.body, kind="ev"))
            if case.kind != "huge":  # a frame too big, or a number too big, is one fault: said once a minute
                expected[expected_line(op, case, mesh=False)] += 1
        expected[r"dropped a bad frame.*: not valid JSON: integer \d+ is out of range"] = 1
        expected[r"dropped a bad frame: frame of \d+ bytes exceeds"] = 1
        worker.send(frame("step", {"rank": 0, "step": 1}, kind="ev", v=2))
        expected[r"dropped a bad frame.*protocol version 2 unsupported"] += 1
        wait_lines(a, start, expected)
    finally:
        worker.close()


def test_the_member_refuses_each_malformed_coordinator_message_by_name(tmp_path: Path) -> None:
    """The test is the coordinator: the daemon finds the rendezvous port taken and joins it as a member."""
    with Job(tmp_path, nnodes="1:2", nproc=1, extra=["--preload", "json"]) as job:
        coord = socket(zmq.ROUTER, f"tcp://127.0.0.1:{job.port}", bind=True)
        try:
            c = job.start("c", PLAIN)
            deadline = time.monotonic() + 30
            while True:  # its `announce` first; a `register` once its zygote is warm
                assert coord.poll(max(1, int((deadline - time.monotonic()) * 1000))), c.output()[-2000:]
                ident, raw = coord.recv_multipart()
                if json.loads(raw)["op"] == MeshOp.register:
                    break
            welcome = {"ok": True, "role": "standby", "round": 0, "events_pub": "", "via": ""}
            coord.send_multipart([ident, frame(MeshOp.welcome, welcome, "coord")])
            start, expected = len(c.lines), Counter[str]()
            for op, case in refused_cases(TO_MEMBER):
                coord.send_multipart([ident, frame(op, case.body, "coord")])
                expected[expected_line(op, case)] += 1
            coord.send_multipart([ident, frame(MeshOp.go, {"round": 1}, "coord", v=2)])
            expected[r"dropped a bad frame from .*: protocol version 2 unsupported"] += 1
            wait_lines(c, start, expected)
        finally:
            coord.close()


def test_the_control_socket_refuses_each_malformed_request_by_name(coordinator: Job) -> None:
    """Every verb: the reply says `bad_argument` (the operator's to fix) and names the field; steering verbs are
    decoded before any interlock, so nothing is changed or even planned."""
    a = coordinator.daemon("a")
    control = socket(zmq.DEALER, a.control)

    def ask(op: str, body: Any, v: int = 1) -> dict[str, Any]:
        control.send(frame(op, body, v=v))
        assert control.poll(10_000), f"no reply to a malformed {op}"
        reply: dict[str, Any] = json.loads(control.recv())["body"]
        return reply

    try:
        asked = 0
        for op, case in refused_cases({name: command.request for name, command in REGISTRY.items()}):
            reply, asked = ask(op, case.body), asked + 1
            if case.kind == "huge" and not isinstance(case.body[case.field], str):
                assert (reply["ok"], reply["code"]) == (False, "invalid_json"), (op, case, reply)
            elif case.kind == "huge":  # 300 KB of text: the frame is over the request cap before any field is read
                assert (reply["ok"], reply["code"]) == (False, "bad_message"), (op, case, reply)
                assert "exceeds" in reply["reason"]
            else:
                assert (reply["ok"], reply["code"]) == (False, "bad_argument"), (op, case, reply)
                assert f"{op}: field '{case.field}'" in reply["reason"], (op, case, reply)
        assert asked >= 3 * len(REGISTRY)  # every verb has at least `client`: wrong type, too big, and one more
        reply = ask("status", {}, v=2)
        assert (reply["ok"], reply["code"]) == (False, "version"), reply
        assert "protocol version 2 unsupported" in reply["reason"]
    finally:
        control.close()
    assert "Traceback" not in a.output() and a.proc.poll() is None, a.output()[-3000:]
    assert coordinator.status()["state"] == "waiting"
