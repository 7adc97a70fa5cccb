"""Property-based fuzzing of every input surface: control verbs, telemetry, the worker channel and the mesh.

Most cases are pure-function fuzzing (fast, ≥ 10k in all): `protocol.decode`, every verb's request record, every
verb's handler on an in-process Coordinator, the coordinator's peer dispatcher, the console model's `ingest`, and
the client's subscription against a fake PUB. A few hundred cases then hit one live 2-node job on its control
ROUTER, its worker channel and its mesh ROUTER; afterwards `status` still answers correctly, membership is unchanged and
the shim workers keep stepping. Regressions of the bugs this fuzzing found close the module.

`FUZZ_SCALE` multiplies every target's case count (bench/fuzz.py runs it at 100k cases); `FUZZ_REPORT` names
a JSON file that receives the counts per target and the daemons' survival. Every test counts its own cases
and checks that each target it fed got them all, so a run that silently fuzzed less fails, whatever else ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.harness import Job

from elasticd.client import AsyncClient, Client
from elasticd.commands.registry import REGISTRY
from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.membership import MemoryStore
from elasticd.job.config import JobConfig
from elasticd.job.events import EventLog
from elasticd.job.runtime import id_digest
from elasticd.member.worker_output import WorkerOutput
from elasticd.wire.member_state import Register
from elasticd.wire.names import RELAY_DOWN, RELAY_MANY, RELAY_UP, MeshOp
from elasticd.wire.protocol import Envelope, ErrorCode, ProtocolError, _may_overflow, decode, encode
from tui.feeds import ingest
from tui.session import JobSession

SCALE = float(os.environ.get("FUZZ_SCALE", "1"))
REPORTED: Counter[str] = Counter()  # cases per target over the tests that ran: for FUZZ_REPORT, never checked


@pytest.fixture(autouse=True, scope="module")
def quiet() -> Iterator[None]:
    """Every dropped message is a log line; millions of captured records would cost more than the cases."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


@pytest.fixture(autouse=True, scope="module")
def fuzz_report(request: pytest.FixtureRequest) -> Iterator[None]:
    """For bench/fuzz.py: the cases per target and the live job's state, once every test of the module ran."""
    path = os.environ.get("FUZZ_REPORT")
    live = request.getfixturevalue("live") if path else None  # requested here: torn down after the report
    yield
    if path and live is not None:
        alive = {node: d.proc.poll() is None for node, d in live.daemons.items()}
        Path(path).write_text(json.dumps({"counts": dict(REPORTED), "total": sum(REPORTED.values()),
                                          "daemons_alive": alive, "status_after": live.job.status()}, indent=1))


def scaled(examples: int) -> int:
    return max(1, int(examples * SCALE))


def fuzz(examples: int) -> Any:
    return settings(max_examples=scaled(examples), deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


def tally(cases: Counter[str], at_least: int) -> None:
    """One test's own counts: every target it fed got at least `at_least` cases."""
    assert cases and min(cases.values()) >= at_least, (cases, at_least)
    REPORTED.update(cases)


def fuzzed(examples: int, check: Callable[..., None], *strategies: Any, per_case: int = 1) -> None:
    """`check(cases, *drawn)` on `examples` (times FUZZ_SCALE) hypothesis cases; each counts `per_case` at least."""
    cases: Counter[str] = Counter()

    @fuzz(examples)
    @given(st.tuples(*strategies))
    def case(drawn: tuple[Any, ...]) -> None:
        check(cases, *drawn)

    case()
    tally(cases, scaled(examples) * per_case)


# ---- strategies: what can arrive on the wire ------------------------------------------------------------
# Integers stay within ±2**63 and floats finite: decode refuses anything else (JSON 1e400, NaN, huge
# integers), which once crashed several handlers; the regressions at the end cover those.
INT = st.integers(-(2**63), 2**63)
SCALAR = st.none() | st.booleans() | INT | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
JSON = st.recursive(SCALAR, lambda k: st.lists(k, max_size=4) | st.dictionaries(st.text(max_size=6), k, max_size=4),
                    max_leaves=10)
ARG_NAMES = ["node", "nodes", "rank", "dry_run", "force", "since_seq", "since_ts", "kinds", "limit", "history",
             "client", "round", "step", "at", "instance", "host", "nproc", "ports", "op_id", "kind", "seq",
             "ts", "reason", "hang", "detected", "loss", "samples", "metrics", "request_id", "at_step", "tail",
             "since"]
NODE_IDS = st.sampled_from(["a", "b", "c", "zz", ""])
BODY = st.dictionaries(st.sampled_from(ARG_NAMES) | st.text(max_size=6),
                       JSON | NODE_IDS | st.integers(-2, 5) | st.lists(st.sampled_from(["a", "b", "round_started"])),
                       max_size=6)
ENVELOPE_KEYS = st.sampled_from(["v", "type", "op", "id", "node", "seq", "ts", "body"])
RAW_ENVELOPE = st.fixed_dictionaries({}, optional={
    "v": st.just(1) | JSON, "type": st.sampled_from(["req", "rep", "ev", "hb", "st"]) | JSON,
    "op": st.sampled_from([*REGISTRY, "hello"]) | JSON, "id": st.text(max_size=8) | JSON,
    "node": NODE_IDS | JSON, "seq": INT | JSON, "ts": st.floats(0, 2e9) | JSON, "body": BODY | JSON})
FRAME = (st.binary(max_size=300) | RAW_ENVELOPE.map(lambda d: json.dumps(d).encode())
         | JSON.map(lambda v: json.dumps(v).encode()))


def rand_json(rng: random.Random, depth: int = 0) -> Any:
    """A fast random JSON value (the bulk cases; hypothesis drives the structured ones)."""
    pick = rng.randrange(10 if depth < 3 else 7)
    if pick == 0:
        return None
    if pick == 1:
        return rng.random() < 0.5
    if pick == 2:
        return rng.choice([0, 1, -1, 2, 7, 2**31, -(2**53), rng.randint(-(2**63), 2**63)])
    if pick == 3:
        return rng.choice([0.0, -0.5, 1e300, rng.uniform(-1e9, 1e9)])
    if pick in (4, 5):
        return rng.choice(["", "a", "b", "zz", "round_started", "\x00", "é" * 3, "x" * rng.randrange(200)])
    if pick == 6:
        return rng.choice(ARG_NAMES)
    if pick in (7, 8):
        return {rng.choice(ARG_NAMES) if rng.random() < 0.7 else str(rng.random()): rand_json(rng, depth + 1)
                for _ in range(rng.randrange(5))}
    return [rand_json(rng, depth + 1) for _ in range(rng.randrange(4))]


def rand_body(rng: random.Random) -> dict[str, Any]:
    return {rng.choice(ARG_NAMES): rand_json(rng, 1) for _ in range(rng.randrange(6))}


def rand_frame(rng: random.Random) -> bytes:
    pick = rng.randrange(4)
    if pick == 0:
        return rng.randbytes(rng.randrange(300))
    if pick == 1:
        return json.dumps(rand_json(rng)).encode()
    env = {"v": 1, "type": rng.choice(["req", "rep", "ev", "hb", "st"]), "op": rng.choice([*REGISTRY, "hello"]),
           "id": "x", "node": "a", "seq": 0, "ts": 1.0, "body": rand_body(rng)}
    for key in rng.sample(sorted(env), rng.randrange(3)):
        env[key] = rand_json(rng) if rng.random() < 0.7 else env.pop(key)
    data = json.dumps(env).encode()
    return data if pick == 2 else data[:rng.randrange(len(data) + 1)]


BULK = 50  # seeded cases per hypothesis example in the bulk tests


def envelope(op: str, body: Any, node: str = "", kind: str = "req", **fields: Any) -> bytes:
    return json.dumps({"v": 1, "type": kind, "op": op, "id": "f", "node": node, "seq": 0, "ts": time.time(),
                       "body": body, **fields}).encode()


# ---- pure: the envelope and arguments -------------------------------------------------------------------
def check_decode(cases: Counter[str], frame: bytes) -> None:
    cases["protocol.decode"] += 1
    try:
        env = decode(frame)
    except ProtocolError as err:
        assert 1 <= err.errno <= 11 and err.reason
        return
    assert isinstance(env.body, dict) and isinstance(env.op, str) and env.op
    assert decode(encode(env)).op == env.op  # whatever decodes encodes back


def test_decode_accepts_or_refuses_with_an_error_number() -> None:
    fuzzed(600, check_decode, FRAME)


def check_request(cases: Counter[str], op: str, body: dict[str, Any]) -> None:
    cases["verb_requests.decode"] += 1
    command = REGISTRY[op]
    try:
        request = command.decode(body)
    except ProtocolError as err:
        assert err.errno == ErrorCode.BAD_ARGUMENT and err.reason.startswith(f"{op}: "), (op, body, err)
        return
    assert isinstance(request, command.request)
    assert command.decode(request.encode()) == request  # whatever decodes encodes back


def test_every_request_decodes_or_is_a_bad_argument() -> None:
    fuzzed(300, check_request, st.sampled_from(sorted(REGISTRY)), BODY)


def check_bulk(cases: Counter[str], seed: int) -> None:
    """Seeded bulk cases (fast to make), on the same checks as the hypothesis-structured tests."""
    rng = random.Random(seed)
    for _ in range(BULK):
        check_decode(cases, rand_frame(rng))
        check_verb(cases, rng.choice(sorted(REGISTRY)), rand_body(rng))
        check_peer(cases, rng.choice(["stranger", "b", "c"]), rng.choice(PEER_OPS), rand_body(rng))
        check_ingest(cases, [SimpleNamespace(type=rng.choice(["ev", "hb", "st"]), kind=rng.choice(KINDS), node="a",
                                             seq=rng.randrange(-5, 50), ts=0.0, body=rand_body(rng))])


def test_bulk_random_cases_on_every_pure_target() -> None:
    fuzzed(80, check_bulk, st.integers(0, 2**32), per_case=BULK)


# ---- pure: every verb's handler on an in-process coordinator ------------------------------------------------
def coordinator(nodes: int = 3) -> tuple[Coordinator, list[tuple[str, str, dict[str, Any]]]]:
    """A running coordinator with `nodes` registered nodes in round 1; `sent` records what it would send."""
    sent: list[tuple[str, str, dict[str, Any]]] = []
    cfg = JobConfig(1, nodes, 2, "127.0.0.1", 29400, "fuzzjob", "a", ["train.py"], max_restarts=2)
    c = Coordinator(cfg, MemoryStore(), lambda n, op, b: sent.append((n, op, b)), EventLog(), lambda e: None)
    now = time.time()
    for node_id in "abc"[:nodes]:
        assert c.registration.register(node_id, Register(f"i-{node_id}", "127.0.0.1", 2, ports=[30000 + ord(node_id)]),
                                       now).ok
    c.start_round("start", "fuzz", now, now)
    return c, sent


def run(c: Coordinator, op: str, body: dict[str, Any]) -> dict[str, Any]:
    """As daemon/control.py runs a verb: its body decoded into its request (bad_argument if it does not), then run."""
    command = REGISTRY[op]
    return command.run(c, command.decode(body))


def healthy(c: Coordinator) -> None:
    status = run(c, "status", {})
    assert status["ok"] is True and status["state"] in ("running", "waiting", "stopped", "succeeded", "failed")
    encode(Envelope("rep", "status", status))


def check_verb(cases: Counter[str], op: str, body: dict[str, Any]) -> None:
    cases["commands.run"] += 1
    c, _ = coordinator()
    try:
        result = run(c, op, body)
    except ProtocolError as err:
        assert err.errno in (2, 4, 5, 6, 10) and err.reason, (op, body, err)
    else:
        assert result.get("ok") is True, (op, body, result)
        encode(Envelope("rep", op, result))
        REGISTRY[op].answer(result)  # a reply the CLI can read (a looking verb's record)
    healthy(c)


def test_every_verb_answers_or_refuses_whatever_the_arguments() -> None:
    fuzzed(500, check_verb, st.sampled_from(sorted(REGISTRY)), BODY)


def check_node_verb(cases: Counter[str], port: WorkerOutput, answered: list[str], op: str,
                    body: dict[str, Any]) -> None:
    """A node query's handler on a node's real output reader (a round's log files, one with binary and a long line)."""
    cases["commands.on_node"] += 1
    command = REGISTRY[op]
    assert command.on_node is not None
    try:
        result = asyncio.run(command.on_node(port, command.decode(body)))
    except ProtocolError as err:
        assert err.errno in (ErrorCode.BAD_ARGUMENT, ErrorCode.NOT_FOUND) and err.reason, (op, body, err)
    else:
        reply = result.encode()
        assert reply.get("ok") is True, (op, body, reply)
        encode(Envelope("rep", op, reply))
        assert command.answer(reply) == result  # the CLI reads back what the node answered, binary and long lines too
        answered.append(op)


def test_every_node_verb_answers_or_refuses_whatever_the_arguments(tmp_path: Path) -> None:
    cfg = JobConfig(1, 2, 2, "127.0.0.1", 29400, "fuzzjob", "a", ["train.py"], log_dir=str(tmp_path))
    port = WorkerOutput(cfg, list)
    folder = port.round_folder(1)
    folder.mkdir(parents=True)
    (folder / "rank-0.log").write_bytes(b"step 1\n" * 100 + bytes(range(256)) + b"\n" + b"x" * 300_000)
    (folder / "rank-1.log").write_bytes(b"")
    on_node = sorted(op for op, command in REGISTRY.items() if command.on_node is not None)
    body = st.fixed_dictionaries({"node": NODE_IDS, "rank": st.sampled_from([0, 1]) | st.integers(-2, 3) | JSON,
                                  "round": st.just(1) | st.integers(-1, 2) | JSON},
                                 optional={"tail": st.integers(-5, 2000) | JSON,
                                           "since": st.integers(-5, 400_000) | JSON})
    answered: list[str] = []
    fuzzed(300, lambda cases, op, b: check_node_verb(cases, port, answered, op, b), st.sampled_from(on_node),
           body | BODY)
    assert "logs" in answered  # the cases reached the reader, not only the argument checks


def check_sequence(cases: Counter[str], calls: list[tuple[str, dict[str, Any]]]) -> None:
    c, _ = coordinator()
    for op, body in calls:
        cases["commands.sequence"] += 1
        with contextlib.suppress(ProtocolError):
            run(c, op, body)
        c.tick(time.time() + 1)
        healthy(c)


def test_verbs_in_sequence_keep_the_coordinator_consistent() -> None:
    fuzzed(60, check_sequence, st.lists(st.tuples(st.sampled_from(sorted(REGISTRY)), BODY), min_size=2, max_size=12))


# ---- pure: the coordinator's mesh dispatcher, as fed by a stranger or a member --------------------------------
PEER_OPS = [*MeshOp, "ctl.status", "ctl.drain", "nosuch"]


def check_peer(cases: Counter[str], sender: str, op: str, body: dict[str, Any]) -> None:
    cases["Coordinator.receive"] += 1
    c, _ = coordinator()
    before = {n.node_id: (n.status, n.instance) for n in c.nodes.values() if n.node_id != sender}
    c.receive(sender, Envelope("req", op, body, node=sender), time.time())
    healthy(c)
    after = {n.node_id: (n.status, n.instance) for n in c.nodes.values() if n.node_id != sender}
    assert after == before, "a message from one node changed another node's record"


def test_peer_messages_never_escape_the_dispatcher() -> None:
    fuzzed(400, check_peer, st.sampled_from(["stranger", "b", "c"]), st.sampled_from(PEER_OPS) | st.text(max_size=8),
           BODY)


# ---- pure: the console model ---------------------------------------------------------------------------------
KINDS = ["round_started", "workers_started", "node_role", "node_lost", "job_end", "checkpoint_saved", "step",
         "steps", "heartbeat"]
TELEMETRY = st.builds(lambda t, k, n, s, ts, b: SimpleNamespace(type=t, kind=k, node=n, seq=s, ts=ts, body=b),
                      st.sampled_from(["ev", "hb", "st", "rep", "idle"]), st.sampled_from(KINDS) | st.text(max_size=6),
                      NODE_IDS, INT, st.floats(allow_nan=False, allow_infinity=False), BODY)


def check_ingest(cases: Counter[str], events: list[Any]) -> None:
    session = JobSession("fuzzjob", ["tcp://127.0.0.1:1"], connect=lambda c: None)  # type: ignore[arg-type,return-value]
    for event in events:
        cases["tui.ingest"] += 1
        ingest(session, event)
    model = session.model
    model.apply_status({"job_id": "fuzzjob", "state": "running", "round": 7, "world_size": 2,
                        "nodes": [{"node_id": "a", "status": "alive", "pub": "tcp://x", "control": "tcp://y"}]})
    good = {"seq": model.last_event_seq + 1, "kind": "round_started", "node": "a", "round": 8, "world_size": 4}
    assert model.apply_event(good) and (model.job.round, model.job.world_size) == (8, 4)
    for node in model.nodes.values():
        model.node_liveness(node)
    model.recoveries()


def test_console_model_ingests_any_telemetry() -> None:
    fuzzed(300, check_ingest, st.lists(TELEMETRY, min_size=1, max_size=6))


# ---- the client's subscription against a fake PUB (and a fake control ROUTER for its gap fills) --------------
class FakeDaemon:
    """A PUB that publishes whatever it is told, and a ROUTER answering status/events like a daemon."""

    def __init__(self) -> None:
        ctx = zmq.Context.instance()
        self.pub, self.router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
        for sock in (self.pub, self.router):
            sock.setsockopt(zmq.LINGER, 0)
        self.pub_addr = f"tcp://127.0.0.1:{self.pub.bind_to_random_port('tcp://127.0.0.1')}"
        self.control = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop.is_set():
            if not self.router.poll(50):
                continue
            ident, frame = self.router.recv_multipart()[:2]
            req = json.loads(frame)
            body = {"ok": True, "seq": 0, "events": []} if req["op"] in ("status", "events") else {"ok": True}
            self.router.send_multipart([ident, encode(Envelope("rep", req["op"], body, id=req["id"]))])

    def publish(self, frames: list[list[bytes]]) -> None:
        with self.lock:
            for parts in frames:
                self.pub.send_multipart(parts)

    def beat(self, seq: int = 0, marker: str = "end") -> None:
        self.publish([[b"hb.x/", envelope("heartbeat", {"marker": marker}, node="x", kind="hb", seq=seq)]])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.pub.close()
        self.router.close()


TOPIC = st.sampled_from([b"ev.a/round_started", b"st.a/", b"hb.a/", b"", b"ev.", b"zz"]) | st.binary(max_size=12)
PUB_MESSAGE = st.lists(FRAME, min_size=0, max_size=3).flatmap(lambda rest: TOPIC.map(lambda t: [t, *rest])) | \
    st.tuples(TOPIC, RAW_ENVELOPE.map(lambda d: json.dumps({"v": 1, "type": "ev", "op": "x", **d}).encode())).map(list)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeDaemon]:
    daemon = FakeDaemon()
    yield daemon
    daemon.close()


def until_marker(stream: Iterator[Any], fake: FakeDaemon, marker: str, timeout: float = 10.0) -> list[Any]:
    seen, deadline = [], time.monotonic() + timeout
    for event in stream:
        seen.append(event)
        if event.type == "hb" and isinstance(event.body, dict) and event.body.get("marker") == marker:
            return seen
        assert time.monotonic() < deadline, "the subscription stopped yielding"
        if event.type == "idle":
            fake.beat(marker=marker)
    raise AssertionError("the subscription ended")


def test_client_subscribe_survives_a_garbage_publisher(fake: FakeDaemon) -> None:
    client = Client(fake.control, timeout_s=5)
    stream = client.subscribe(fake.pub_addr, idle_timeout_s=0.2)
    try:
        until_marker(stream, fake, "ready")  # subscribed for real: heartbeats arrive

        def batch(cases: Counter[str], messages: list[list[bytes]]) -> None:
            fake.publish(messages)
            cases["client.subscribe"] += len(messages)
            fake.beat(seq=0, marker="end")
            assert until_marker(stream, fake, "end")[-1].body["marker"] == "end"

        fuzzed(60, batch, st.lists(PUB_MESSAGE, min_size=1, max_size=10))
    finally:
        stream.close()
        client.close()


def test_async_client_events_survive_a_garbage_publisher(fake: FakeDaemon) -> None:
    cases: Counter[str] = Counter()
    rounds = scaled(60)

    async def main() -> None:
        client = AsyncClient(fake.control, timeout_s=5)
        stream = client.events(fake.pub_addr, idle_timeout_s=0.2).__aiter__()

        async def until(marker: str) -> None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                event = await asyncio.wait_for(stream.__anext__(), 10)
                if event.type == "hb" and isinstance(event.body, dict) and event.body.get("marker") == marker:
                    return
                if event.type == "idle":
                    fake.beat(marker=marker)
            raise AssertionError("no marker")

        try:
            await until("ready")
            rng = random.Random(7)
            for i in range(rounds):
                messages = [[rng.choice([b"ev.a/x", b"hb.a/", b"st.a/", b"", rng.randbytes(5)]),
                             *[rand_frame(rng) for _ in range(rng.randrange(3))]] for _ in range(rng.randrange(1, 10))]
                fake.publish(messages)
                cases["asyncclient.events"] += len(messages)
                fake.beat(marker=f"m{i}")
                await until(f"m{i}")
        finally:
            await stream.aclose()
            client.close()

    asyncio.run(main())
    tally(cases, rounds)


# ---- a live 2-node job: control ROUTER, worker channel, mesh ----------------------------------------------------
STEPPER = """\
import itertools, sys, time, trainer_shim
session = trainer_shim.init()
for step in itertools.count(1):
    session.report(step, loss=1.0 / step, samples=1)
    if session.should_stop(step):  # a reform (b joining) drains the workers at one agreed step
        session.drained(step)
        sys.exit(0)
    time.sleep(0.05)
"""


class Live:
    def __init__(self, tmp: Path) -> None:
        script = tmp / "stepper.py"
        script.write_text(STEPPER)
        # Relays on (as in a job of 256 nodes): b relays for nobody, and its relay ROUTER is fuzzed too.
        self.job = Job(tmp, nnodes="1:2", nproc=1, extra=["--preload", "json", "--hang-timeout", "30",
                                                           "--rdzv-conf", "relay_group=1,relay_from=2"])
        self.daemons = {node: self.job.start(node, script) for node in "ab"}
        self.round = self.job.wait_event("round_started", lambda e: e["world_size"] == 2)
        self.steps = self.wait_steps({0: 0, 1: 0})
        self.before = self.job.status()

    def wait_steps(self, after: dict[int, int], timeout: float = 30.0) -> dict[int, int]:
        """Both ranks report a step beyond `after` (from the `metrics` verb)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.job.client() as client:
                ranks = {m["rank"]: m.get("step") or 0 for m in client.call("metrics")["ranks"]}
            if all(ranks.get(r, 0) > s for r, s in after.items()):
                return ranks
            time.sleep(0.2)
        raise AssertionError(f"the workers stopped stepping: {ranks} vs {after}")

    def worker_addr(self, node: str) -> str:
        digest = id_digest(f"{self.job.job_id}--{node}")  # elasticd/job/runtime.py worker_socket, in the job's folder
        return f"ipc://{self.job.tmp / 'run'}/w-{digest}-{self.daemons[node].proc.pid}.sock"

    def check(self) -> None:
        """The daemons are up, membership and the round unchanged, and the workers still step."""
        for node, daemon in self.daemons.items():
            assert daemon.proc.poll() is None, daemon.output()[-3000:]
            status = self.job.status(node)
            assert (status["state"], status["round"], status["world_size"]) == ("running", self.round["round"], 2)
            assert status["restarts"] == self.before["restarts"]
            assert [(n["node_id"], n["status"], n["instance"]) for n in status["nodes"]] == \
                [(n["node_id"], n["status"], n["instance"]) for n in self.before["nodes"]]
        self.steps = self.wait_steps(self.steps)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    job = None
    try:
        job = Live(tmp_path_factory.mktemp("fuzz_live"))
        yield job
    finally:
        if job is not None:
            job.job.close()


def dealer(addr: str, identity: bytes | None = None) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(addr)
    return sock


def test_live_control_router_answers_random_requests(live: Live) -> None:
    socks = {node: dealer(d.control) for node, d in live.daemons.items()}

    def request(cases: Counter[str], op: str, body: dict[str, Any], node: str) -> None:
        if op in REGISTRY and REGISTRY[op].steer:
            body = {**body, "dry_run": True}  # a dry run is checked like the real thing and changes nothing
        socks[node].send(envelope(op, body, id=f"r{cases['live.control']}"))
        cases["live.control"] += 1
        assert socks[node].poll(10_000), f"no reply to {op} {body!r:.200}"
        reply = json.loads(socks[node].recv())
        assert reply["type"] == "rep" and isinstance(reply["body"].get("ok"), bool)
        assert reply["body"].get("errno") != 9, reply  # `internal`: a verb raised inside the daemon

    try:
        fuzzed(150, request, st.sampled_from([*REGISTRY, "hello"]) | st.text(min_size=1, max_size=10), BODY,
               st.sampled_from("ab"))
    finally:
        for sock in socks.values():
            sock.close()
    live.check()


# Well-formed worker frames use ranks no worker has (a real rank's frames are the worker's own business), and
# never `hello` in the current round (a rank that says hello and never steps is, rightly, judged hung).
FAKE_RANK = st.integers(2, 2**40) | st.integers(-(2**40), -1) | st.text(max_size=4).filter(lambda s: not s.isdigit())


@st.composite
def worker_frame(draw: st.DrawFn) -> list[bytes]:
    pick = draw(st.integers(0, 3))
    if pick == 0:
        return draw(st.lists(st.binary(max_size=200), min_size=1, max_size=3))
    body = {**draw(BODY), "rank": draw(FAKE_RANK)}
    op = draw(st.sampled_from(["step", "checkpoint", "checkpoint_skipped", "ack", "drained", "hello", "zz"]))
    if op == "hello":
        body["round"] = draw(st.integers(1000, 2000))
    return [envelope(op, body, kind=draw(st.sampled_from(["ev", "req", "hb"])))]


def test_live_worker_channel_ignores_garbage(live: Live) -> None:
    socks = [dealer(live.worker_addr(node)) for node in "ab"]

    def garbage(cases: Counter[str], frames: list[list[bytes]], which: int) -> None:
        for parts in frames:
            socks[which].send_multipart(parts)
            cases["live.worker_channel"] += 1

    try:
        fuzzed(250, garbage, st.lists(worker_frame(), min_size=1, max_size=4), st.integers(0, 1))
    finally:
        for sock in socks:
            sock.close()
    live.check()


@st.composite
def mesh_frame(draw: st.DrawFn) -> tuple[bytes | None, list[bytes]]:
    """Garbage from an anonymous DEALER, envelopes from strangers that speak for themselves, or relay batches
    from strangers that speak for others (the members `a` and `b` among them)."""
    kind = draw(st.sampled_from(["garbage", "stranger", "batch"]))
    if kind == "garbage":
        return None, draw(st.lists(FRAME, min_size=1, max_size=3))
    name = draw(st.sampled_from(["fuzz1", "fuzz2", "zz"]))
    op = draw(st.sampled_from([o for o in PEER_OPS if o != "register" and not o.startswith("ctl.")]))
    frame = envelope(op, draw(BODY), node=draw(st.sampled_from([name, "a", "b"])))
    if kind == "stranger":
        return f"{name}|x".encode(), [frame]
    marker = draw(st.sampled_from([RELAY_UP, RELAY_DOWN, RELAY_MANY]))
    member = draw(st.sampled_from([b"a|x", b"b|x", b"zz|y", b""]))
    return f"{name}|x".encode(), [marker, *draw(st.lists(st.sampled_from([member, frame, b""]), max_size=5))]


def fuzz_router(live: Live, addr: str, case: str) -> None:
    """mesh_frame()s from DEALERs of their identities at `addr`; then the job must be as it was."""
    socks: dict[bytes | None, zmq.Socket] = {}

    def garbage(cases: Counter[str], frames: list[tuple[bytes | None, list[bytes]]]) -> None:
        for identity, parts in frames:
            if identity not in socks:
                socks[identity] = dealer(addr, identity)
            socks[identity].send_multipart(parts)
            cases[case] += 1

    try:
        fuzzed(250, garbage, st.lists(mesh_frame(), min_size=1, max_size=4))
        live.check()  # after at least 3 s: a disturbed membership would show as a lost node by now
    finally:
        for sock in socks.values():
            sock.close()


def test_live_mesh_ignores_garbage_dealers(live: Live) -> None:
    fuzz_router(live, f"tcp://127.0.0.1:{live.job.port}", "live.mesh")


def test_live_relay_forwards_garbage_that_changes_nothing(live: Live) -> None:
    """A relay passes on what it reads unread; the coordinator takes none of it from a stranger (nor a member's
    frame through a relay it was not given)."""
    fuzz_router(live, next(n["relay_endpoint"] for n in live.before["nodes"] if n["node_id"] == "b"), "live.relay")


# ---- regressions: non-finite and huge numbers (JSON `1e400` is infinity) once escaped the handlers' guards --
@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"NaN", b"Infinity", b"1" + b"0" * 400, b"-1E+0400",
                                    str(2**63).encode(), str(-(2**63)).encode(), b"1.5e00400"])
def test_decode_refuses_non_finite_and_huge_numbers(number: bytes) -> None:
    frame = b'{"v":1,"type":"req","op":"x","body":{"n":' + number + b"}}"
    for encoded in (frame, frame.decode().encode("utf-16")):  # JSON may come in UTF-16 too (RFC 8259 readers)
        with pytest.raises(ProtocolError):
            decode(encoded)


@pytest.mark.parametrize("number", [2**63 - 1, -(2**63) + 1, 123456789012345678, 1.5e308, 2.5e-300])
def test_decode_takes_every_number_in_range(number: float) -> None:
    """Most frames skip the per-number checks (a scan finds no 19-digit run or 3-digit exponent): the edges."""
    assert decode(b'{"v":1,"type":"req","op":"x","body":{"n":' + repr(number).encode() + b"}}").body == {"n": number}


def test_only_a_number_sends_a_frame_through_the_per_number_checks() -> None:
    """A daemon's hex instance id ("9e019d") looks like an exponent to the byte scan: it must not cost every
    heartbeat of one node in eight the slow path, while a real 3-digit exponent always takes it."""
    assert not _may_overflow(b'{"instance":"6d849e019d80","s":"1e400","n":1e40}')
    assert all(_may_overflow(b'{"n":[' + n + b"]}") for n in (b"1e400", b"2E+0400 ", b"3e-999", b"1" * 19))


@pytest.mark.parametrize("op,body", [("first_step", {"round": 1e400, "at": 0}),
                                     ("register", {"instance": "i", "host": "h", "nproc": 1e400}),
                                     ("first_step", {"round": 1, "at": 10**400})])
def test_peer_dispatcher_survives_non_finite_numbers(op: str, body: dict[str, Any]) -> None:
    """The decoder refuses these now; the dispatcher must survive them anyway (defence in depth)."""
    c, sent = coordinator()
    body = {k: (math.inf if v == 1e400 else v) for k, v in body.items()}
    before = (c.events.seq, len(sent), {n.node_id: n.status for n in c.nodes.values()})
    c.receive("zz", Envelope("req", op, body, node="zz"), time.time())
    healthy(c)
    assert (c.events.seq, len(sent), {n.node_id: n.status for n in c.nodes.values()}) == before, \
        "a frame with a non-finite number changed the job"


def test_console_ingest_skips_non_finite_numbers() -> None:
    session = JobSession("fuzzjob", ["tcp://127.0.0.1:1"], connect=lambda c: None)  # type: ignore[arg-type,return-value]
    ingest(session, SimpleNamespace(type="ev", kind="x", node="a", seq=1, ts=0.0, body={"seq": math.inf}))
    assert not session.model.events and session.model.last_event_seq == 0  # skipped, not half-applied
    ingest(session, SimpleNamespace(type="ev", kind="round_started", node="a", seq=1, ts=0.0,
                                    body={"round": 2, "world_size": 2}))
    assert session.model.last_event_seq == 1 and session.model.job.round == 2  # the next event still counts


# The same on the live job: when these were bugs they broke it, so they run last.
def test_live_worker_channel_survives_a_non_finite_rank(live: Live) -> None:
    sock = dealer(live.worker_addr("a"))
    try:
        sock.send(b'{"v":1,"type":"ev","op":"step","body":{"rank":1e400,"step":1}}')
        # two windows of progress: the second starts after a heartbeat that followed the frame
        live.steps = live.wait_steps(live.wait_steps(live.steps, timeout=5), timeout=5)
    finally:
        sock.close()


def test_live_mesh_survives_a_non_finite_number(live: Live) -> None:
    sock = dealer(f"tcp://127.0.0.1:{live.job.port}", b"zz|x")
    try:
        sock.send(b'{"v":1,"type":"req","op":"first_step","node":"zz","body":{"round":1e400,"at":0}}')
        deadline = time.monotonic() + 6  # two lost_after_s windows
        while time.monotonic() < deadline:
            nodes = {n["node_id"]: n["status"] for n in live.job.status()["nodes"]}
            assert nodes["b"] == "alive", nodes
            time.sleep(0.5)
    finally:
        sock.close()
