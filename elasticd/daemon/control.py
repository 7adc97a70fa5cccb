"""The operator API of one daemon: a ROUTER for requests and a PUB for events and heartbeats."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any, Protocol

import zmq
import zmq.asyncio

from elasticd import __version__
from elasticd.commands.registry import REGISTRY
from elasticd.commands.verb import Command, changes
from elasticd.coordinator.coordinator import Coordinator
from elasticd.daemon.node_queries import NodeQueries
from elasticd.job.config import JobConfig, StartError
from elasticd.job.events import EventLog
from elasticd.keys.auth import Gatekeeper, NodeKeys, serve_curve
from elasticd.member.agent import NodeAgent
from elasticd.mesh.router import MORE_NOBLOCK, NOBLOCK
from elasticd.wire.names import CTL_PREFIX, EventKind
from elasticd.wire.protocol import (
    PROTOCOL_VERSION,
    Envelope,
    ErrorCode,
    Json,
    ProtocolError,
    decode,
    encode,
    error_reply,
    new_id,
    reply,
)
from elasticd.wire.telemetry import StepRow, StepTelemetry
from elasticd.wire.verb_replies import Hello, served
from elasticd.wire.verb_requests import NodeQueryRequest, VerbRequest

log = logging.getLogger("elasticd")
FORWARD_TIMEOUT_S = 5.0
STEP_TELEMETRY_S = 0.25
CAPABILITIES = ["snapshot-seq", "dry-run", "force", "forward", *sorted(REGISTRY)]


class ControlHost(Protocol):
    """What the operator sockets need of their daemon, and nothing more."""

    cfg: JobConfig
    ctx: zmq.asyncio.Context
    keys: NodeKeys | None
    gate: Gatekeeper | None
    events: EventLog
    node: NodeAgent
    endpoints: dict[str, str]
    queries: NodeQueries

    @property
    def coordinator(self) -> Coordinator | None: ...
    @property
    def events_pub(self) -> str: ...
    def node_event(self, kind: EventKind, **fields: Json) -> None: ...
    def steering_held(self) -> str: ...
    def forward(self, op: str, body: dict[str, Any], msg_id: str) -> bool: ...
    def answer_forward(self, node_id: str, op: str, body: dict[str, Any], msg_id: str) -> None: ...


class ControlPlane:
    """One daemon's operator sockets: requests answered here (or forwarded to the coordinator), events published."""

    def __init__(self, d: ControlHost) -> None:
        self.d = d
        self.router = d.ctx.socket(zmq.ROUTER)
        # The PUB only sends (NOBLOCK), so it is a plain socket: asyncio's future per send cost as much as the
        # event's JSON when a round publishes thousands of events (one per node's workers stopped, started).
        self.pub: zmq.Socket[bytes] = zmq.Context.shadow(d.ctx.underlying).socket(zmq.PUB)
        self.pending: dict[str, tuple[bytes, Envelope, float]] = {}  # forwarded id -> (client, request, due)
        self.stats = {"requests": 0, "errors": 0, "dropped": 0}
        self.steps_sent = 0.0

    def bind(self) -> dict[str, str]:
        for sock in (self.router, self.pub):
            sock.setsockopt(zmq.LINGER, 0)
            if self.d.keys is not None:
                serve_curve(sock, self.d.keys.secret, self.d.keys.public, "control")
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished client is counted, not lost silently
        self.pub.setsockopt(zmq.SNDHWM, 10000)  # a stuck subscriber loses events, the daemon never stalls
        return {"control": self._bind(self.router, self.d.cfg.control_bind),
                "pub": self._bind(self.pub, self.d.cfg.pub_bind)}

    @staticmethod
    def _bind(sock: zmq.Socket, addr: str) -> str:
        if addr.startswith("ipc://"):
            check_private_folder(addr)
        try:
            if not addr:
                port = sock.bind_to_random_port("tcp://127.0.0.1")
                return f"tcp://127.0.0.1:{port}"
            sock.bind(addr)
        except zmq.ZMQError as exc:
            reason = "address in use" if exc.errno == zmq.EADDRINUSE else str(exc)
            raise StartError(f"cannot bind {addr or 'a loopback port'}: {reason}") from None
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def tasks(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self.serve())]

    # ---- telemetry ---------------------------------------------------------------------------
    def publish_event(self, event: dict[str, Any]) -> None:
        env = Envelope("ev", str(event.get("kind", "event")), event, node=str(event.get("node", "")),
                       seq=int(event.get("seq", 0)), ts=float(event.get("ts", time.time())))
        self._publish(f"ev.{env.node}/{env.op}", env)

    def publish_steps(self, now: float) -> None:
        """This node's shim ranks on `st.<node>`, at most 4 times a second and only when a step moved."""
        node = self.d.node
        if now - self.steps_sent < STEP_TELEMETRY_S or not node.rank_reports.take_moved():
            return
        self.steps_sent = now
        ranks = [StepRow(m["rank"], m.get("step"), m.get("loss"), m.get("throughput"), m.get("samples"),
                         m.get("step_time"), m.get("last_step_at")) for m in node.rank_reports.of_round(node.round_id)]
        body = StepTelemetry(node.round_id, ranks).encode()
        self._publish(f"st.{self.d.cfg.node_id}/", Envelope("st", "steps", body, node=self.d.cfg.node_id,
                                                          seq=self.d.events.seq, ts=now))

    def heartbeat(self) -> None:
        self.expire_forwards()
        self.d.queries.expire(time.time())
        c = self.d.coordinator
        body = {"state": self.d.node.state, "round": self.d.node.round_id,
                "job_state": c.state if c else None, "coordinator": c is not None}
        self._publish(f"hb.{self.d.cfg.node_id}/", Envelope("hb", "heartbeat", body, node=self.d.cfg.node_id,
                                                          seq=self.d.events.seq, ts=time.time()))

    def _publish(self, topic: str, env: Envelope) -> None:
        try:
            self.pub.send(topic.encode(), MORE_NOBLOCK)  # plain ints: multipart's flag enums cost as much
            self.pub.send(encode(env), NOBLOCK)
        except zmq.ZMQError:
            self.stats["dropped"] += 1

    # ---- requests ----------------------------------------------------------------------------
    async def serve(self) -> None:
        while True:
            parts = await self.router.recv_multipart(copy=False)
            frames = [part.bytes for part in parts]
            user = str(parts[-1].get("User-Id")) if self.d.gate is not None else ""
            self.stats["requests"] += 1
            self.expire_forwards()
            if len(frames) < 2:
                self.stats["dropped"] += 1
                continue
            ident = frames[0]
            if len(frames) != 2:
                self.send(ident, error_reply("", "error", self.d.cfg.node_id, ProtocolError(
                    ErrorCode.BAD_MESSAGE, f"a request is one frame; got {len(frames) - 1}")))
                continue
            try:
                env = decode(frames[1])
                if env.type != "req":
                    raise ProtocolError(ErrorCode.BAD_MESSAGE, f"expected type 'req', got {env.type!r}")
                self.handle(ident, env, user)
            except ProtocolError as err:
                self.stats["errors"] += 1
                self.send(ident, error_reply(_safe_id(frames[1]), "error", self.d.cfg.node_id, err))
            except Exception as exc:  # one bad request must never end the loop that serves everyone
                log.exception("control request failed")
                self.send(ident, error_reply(_safe_id(frames[1]), "error", self.d.cfg.node_id,
                                             ProtocolError(ErrorCode.INTERNAL, f"request failed: {exc!r}")))
            await asyncio.sleep(0)  # a pipelined flood must not starve heartbeats and rounds

    def handle(self, ident: bytes, env: Envelope, user: str = "") -> None:
        if env.op == "hello":
            self.send(ident, reply(env, self.d.cfg.node_id, self.hello().encode()))
            return
        command = REGISTRY.get(env.op)
        if command is None:
            raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {env.op!r}; known: hello, {', '.join(REGISTRY)}")
        try:
            request = command.decode(env.body, env.size)  # once, here: everything after gets the record
        except ProtocolError:
            self.admit(env, command.steer, user, "?")  # a malformed request is authorized and recorded first too
            raise
        self.admit(env, command.steer, user, request.client)
        if isinstance(request, NodeQueryRequest) and self.d.queries.ask(
                env.op, request, lambda body: self.send(ident, reply(env, self.d.cfg.node_id, body))):
            return  # answered here, or carried to the node it names; else forwarded like any verb
        if self.d.coordinator is not None:
            self.send(ident, reply(env, self.d.cfg.node_id, self.own_view(env.op, self.execute(command, request))))
            return
        fwd = new_id()
        if not self.d.forward(env.op, env.body, fwd):
            raise ProtocolError(ErrorCode.NOT_RUNNING, "this daemon is not connected to its coordinator yet")
        self.pending[fwd] = (ident, env, time.time() + FORWARD_TIMEOUT_S)

    def admit(self, env: Envelope, steer: bool, user: str, claimed: str) -> None:
        """Authorize the request; a steering one, valid or not, is recorded as it came (`command_received`)."""
        who = self.authorize(env.op, steer, user, claimed)
        if steer:
            self.d.node_event(EventKind.command_received, op=env.op, by=who,
                              args={k: v for k, v in env.body.items() if k != "client"})

    def authorize(self, op: str, steer: bool, user: str, claimed: str) -> str:
        """Who is asking; a viewer's steer verb, or a key revoked since it connected, is refused and logged."""
        if self.d.gate is None:
            return claimed  # no keys: loopback only (start refuses otherwise), every local user may steer
        key = self.d.gate.role_of(user)
        if key is None:
            self.d.node_event(EventKind.unauthorized, op=op, by=claimed, reason="key not authorized (revoked?)")
            raise ProtocolError(ErrorCode.UNAUTHORIZED, "this key is not authorized (revoked?)")
        if steer and key.role != "operator":
            self.d.node_event(EventKind.unauthorized, op=op, by=key.name, reason=f"role {key.role} cannot steer")
            raise ProtocolError(ErrorCode.UNAUTHORIZED, f"key '{key.name}' has role {key.role}: it may read, not steer")
        return f"{key.name} ({key.role})"

    def execute(self, command: Command[VerbRequest], request: VerbRequest) -> dict[str, Any]:
        """Run a verb at the coordinator; interlock refusals become events as well as replies."""
        c = self.d.coordinator
        assert c is not None
        held = self.d.steering_held() if changes(request) else ""
        if held:  # applied now, it would be lost or undone by the coordinator that takes over
            return ProtocolError(ErrorCode.NOT_RUNNING, f"{command.name}: {held}; nothing was changed").as_body()
        try:
            return command.run(c, request)
        except ProtocolError as err:
            if err.errno == ErrorCode.REFUSED:
                c.emit(EventKind.interlock_refused, op=command.name, reason=err.reason)
            return err.as_body()
        except Exception as exc:  # a verb's bug must not take the daemon down
            log.exception("verb %s failed", command.name)
            return ProtocolError(ErrorCode.INTERNAL, f"{command.name} failed inside the daemon: {exc!r}").as_body()

    def own_view(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """A job-wide answer plus what only the daemon asked knows: `status` carries its refused handshakes."""
        if op != "status" or not served(body):
            return body
        return {**body, "refused_keys": self.refused_keys()}

    def refused_keys(self) -> int:
        return self.d.gate.refusals.total if self.d.gate is not None else 0

    def hello(self) -> Hello:
        d = self.d
        return Hello(version=__version__, protocol=PROTOCOL_VERSION, capabilities=CAPABILITIES, node=d.cfg.node_id,
                     job_id=d.cfg.job_id, coordinator=d.coordinator is not None,
                     rendezvous=f"{d.cfg.rdzv_host}:{d.cfg.rdzv_port}", control=d.endpoints["control"],
                     pub=d.endpoints["pub"], events_pub=d.events_pub,
                     stats={**self.stats, "refused_keys": self.refused_keys()})

    # ---- forwarding between a member and the coordinator ------------------------------------------
    def on_forwarded(self, sender: str, env: Envelope) -> None:
        """Coordinator side: run a member's forwarded request (decoded here, where it arrives), answer it back."""
        op = env.op.removeprefix(CTL_PREFIX)
        command = REGISTRY.get(op)
        try:
            if command is None:
                raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {op!r}")
            request = command.decode(env.body, env.size)
            if isinstance(request, NodeQueryRequest):
                self.d.queries.ask(op, request, lambda body: self.d.answer_forward(sender, env.op, body, env.id))
                return
        except ProtocolError as err:
            self.d.answer_forward(sender, env.op, err.as_body(), env.id)
            return
        self.d.answer_forward(sender, env.op, self.execute(command, request), env.id)

    def on_forwarded_reply(self, env: Envelope) -> None:
        entry = self.pending.pop(env.id, None)
        if entry is not None:
            ident, request, _ = entry
            self.send(ident, reply(request, self.d.cfg.node_id, self.own_view(request.op, env.body)))

    def expire_forwards(self) -> None:
        now = time.time()
        for fwd, (ident, request, due) in list(self.pending.items()):
            if now > due:
                del self.pending[fwd]
                self.send(ident, error_reply(request.id, request.op, self.d.cfg.node_id, ProtocolError(
                    ErrorCode.TIMEOUT, "the coordinator did not answer in time")))

    def send(self, ident: bytes, env: Envelope) -> None:
        try:
            self.router.send_multipart([ident, encode(env)], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            self.stats["dropped"] += 1  # the client is gone or not reading: its loss, not ours

    def close(self) -> None:
        self.router.close()
        self.pub.close()


def check_private_folder(addr: str) -> None:
    """An ipc:// socket is as private as its folder: anyone who can enter it can steer the job."""
    folder = os.path.dirname(os.path.abspath(addr[len("ipc://"):])) or "."
    try:
        mode = os.stat(folder).st_mode & 0o777
    except OSError as exc:
        raise StartError(f"cannot use {addr}: {exc.strerror} ({folder})") from None
    if mode & 0o077:
        raise StartError(f"{addr}: its folder {folder} is open to other users (mode {mode:04o}); "
                         "put ipc:// endpoints in a 0700 folder")


def _safe_id(frame: bytes) -> str:
    """Echo a request id back even on a bad request, when one can be found."""
    try:
        raw = json.loads(frame)
        return raw["id"] if isinstance(raw, dict) and isinstance(raw.get("id"), str) else ""
    except (ValueError, UnicodeDecodeError, RecursionError):
        return ""
