"""A node's side of the mesh: registering, the welcome, heartbeats, leaving, acting on the coordinator's word."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from elasticd.job.config import JobConfig
from elasticd.job.events import EventLog
from elasticd.member.agent import NodeAgent, ToCoordinator
from elasticd.member.failures import failure_summary
from elasticd.member.worker_channel import WorkerChannel
from elasticd.wire.assignment import TO_MEMBER, CoordinatorBeat, JobEnd, NodeQuery, Unknown, Welcome
from elasticd.wire.names import CTL_PREFIX, MeshOp, WorkerOp
from elasticd.wire.protocol import Envelope, ErrorCode, ProtocolError

log = logging.getLogger("elasticd")
EXIT_COORDINATOR_LOST = 3
# A coordinator whose process still holds our connection (answers ZeroMQ's heartbeats) but has said nothing
# for this many loss limits is wedged, not slow: a starved one on a loaded machine answers long before.
WEDGED_LIMITS = 10
# What a node on its way out still acts on: its workers' drain, and the word that it is out (or the job is over).
LEAVING_OPS = frozenset({MeshOp.left, MeshOp.job_end, MeshOp.hb, MeshOp.probe, MeshOp.step_query,
                         MeshOp.drain_workers, MeshOp.checkpoint_workers, MeshOp.resize_workers, MeshOp.relay})


class MeshLink(Protocol):
    """The member's link to the coordinator as the member sees it (member_mesh.py; failover may replace it)."""

    def backlog(self) -> bool: ...  # frames from the coordinator wait to be read
    def link_up(self) -> bool: ...  # the coordinator's (or our relay's) process holds our connection
    def foreign(self) -> bool: ...  # a program at the coordinator's endpoint took the connection, never as ours
    def route(self, via: str) -> None: ...  # send through this relay endpoint from now on ("": directly)
    def state(self) -> dict[str, str]: ...  # the heartbeat's `via` (and `via_failed`)


class Lifecycle(Protocol):
    """What a member needs of the daemon that runs it."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...
    async def finish(self, state: str, reason: str, code: int | None = None, message: str = "") -> None: ...
    def fail_start(self, message: str) -> None: ...


class Member:
    """Registers this node with the coordinator, keeps it alive there, and runs what the coordinator says."""

    def __init__(self, cfg: JobConfig, node: NodeAgent, channel: WorkerChannel, to_coord: ToCoordinator,
                 life: Lifecycle, events: EventLog, publish: Callable[[dict[str, Any]], None],
                 on_forwarded_reply: Callable[[Envelope], None], connect_timeout_s: float,
                 is_coordinator: bool, link: MeshLink,
                 on_node_query: Callable[[NodeQuery], None] = lambda _query: None) -> None:
        self.cfg = cfg
        self.node = node
        self.channel = channel
        self.to_coord = to_coord
        self.life = life
        self.events = events
        self.publish = publish
        self.on_forwarded_reply = on_forwarded_reply
        self.connect_timeout_s = connect_timeout_s
        self.is_coordinator = is_coordinator  # this daemon also holds the coordinator role
        self.await_election = bool(cfg.etcd_endpoints)  # etcd: a silent coordinator is replaced, not the job's end
        self.link = link  # its silence is judged only once its frames are read, and slow is not gone (link_up)
        self.registered = False
        self.joined = False  # welcomed once: --connect-timeout is for a daemon that never joined
        self.leaving = False  # set once: a leaving node never registers again, whatever it is told
        self.events_pub = ""  # the coordinator's PUB, where the job's events are published (from the welcome)
        self.departed = False  # its last word (`leave` without grace) is sent: it only waits to exit now
        self.duplicate_since = 0.0
        self.last_coord = 0.0
        self.last_register = 0.0
        self.first_register = 0.0  # 0 until the zygote is warm and the first `register` went out
        self.last_beat = 0.0
        self.handlers = self.mesh_handlers(on_node_query)

    def mesh_handlers(self, on_node_query: Callable[[NodeQuery], None]) -> dict[str, Callable[[Any], object]]:
        """What each op from the coordinator does (its record decoded in `receive`), and which part does it."""
        node, channel, life, to_coord = self.node, self.channel, self.life, self.to_coord
        return {
            MeshOp.welcome: self.on_welcome,
            MeshOp.hb: self.on_hb,
            MeshOp.unknown: self.on_unknown,
            MeshOp.left: lambda msg: self.exit_job(msg.reason),
            MeshOp.round: lambda msg: life.spawn(node.apply_round(msg)),
            MeshOp.go: lambda msg: node.go(msg.round),
            MeshOp.job_end: self.on_job_end,
            MeshOp.probe: lambda msg: to_coord(MeshOp.pong, {"round": msg.round}),
            MeshOp.step_query: lambda msg: to_coord(MeshOp.step_report, {
                "op_id": msg.op_id, **node.rank_reports.step_answer(node.round_id),
                "in_place": node.in_place.ready()}),
            MeshOp.drain_workers: lambda msg: channel.request(WorkerOp.drain, msg),
            MeshOp.checkpoint_workers: lambda msg: channel.request(WorkerOp.checkpoint, msg),
            MeshOp.resize_workers: lambda msg: channel.request(WorkerOp.resize, msg),
            MeshOp.kill_worker: lambda msg: life.spawn(node.kill_worker(msg.rank)),
            MeshOp.relay: lambda msg: self.link.route(msg.via),
            MeshOp.node_query: on_node_query,  # `logs`, `stacks`: daemon/node_queries.py
        }

    # ---- the coordinator's messages -------------------------------------------------------------
    def receive(self, env: Envelope) -> None:
        self.last_coord = time.time()
        if env.type == "rep" and env.op.startswith(CTL_PREFIX):
            self.on_forwarded_reply(env)
            return
        if not self.registered and env.op not in (MeshOp.welcome, MeshOp.job_end):
            return  # a daemon not yet welcomed acts on nothing: it may be a refused duplicate of a live node
        if self.leaving and env.op not in LEAVING_OPS:
            return  # it said `leave`: no new round, no re-registering, whatever it is told meanwhile
        handler, record = self.handlers.get(env.op), TO_MEMBER.get(env.op)
        if handler is None or record is None:
            return
        try:
            message = record.decode(env.body, env.op, env.size)
        except ProtocolError as err:  # a coordinator of another version, or a corrupt frame: said, not acted on
            log.warning("[%s] ignored a malformed %s from the coordinator: %s", self.cfg.node_id, env.op, err.reason)
            return
        handler(message)

    def on_job_end(self, end: JobEnd) -> None:
        """The job is over; one that failed for good prints torchrun's root-cause table on every node."""
        summary = failure_summary(" ".join(self.cfg.entry[:2]), end.root_cause, end.consequences)
        if summary:
            print(summary, file=sys.stderr, flush=True)
        self.life.spawn(self.life.finish(end.state, end.reason))

    def on_welcome(self, welcome: Welcome) -> None:
        if welcome.ok:
            self.registered, self.joined, self.duplicate_since = True, True, 0.0
            self.events_pub = welcome.events_pub
            self.node.welcomed(welcome.role)
            self.link.route(welcome.via)  # in a large job: through a relay from now on
            if welcome.prewarm:
                self.life.spawn(self.node.prestart(welcome))
            return
        now = time.time()
        # A daemon restarted right after a SIGKILL finds its old self still listed until it is declared
        # lost; keep trying that long before calling the node id a duplicate.
        duplicate = welcome.errno == ErrorCode.DUPLICATE_NODE
        if duplicate and now - (self.duplicate_since or now) < self.cfg.lost_after_s + 2:
            self.duplicate_since = self.duplicate_since or now
            return
        self.life.fail_start(welcome.reason)

    def on_hb(self, beat: CoordinatorBeat) -> None:
        """The coordinator is there, and holds what the answered heartbeat carried."""
        self.events.note_seq(beat.seq)
        self.node.beats.ack(beat.beat)

    def on_unknown(self, _message: Unknown) -> None:
        log.warning("[%s] the coordinator no longer knows this node; stopping workers and re-registering",
                    self.cfg.node_id)
        self.registered = False
        self.life.spawn(self.rejoin())

    async def rejoin(self) -> None:
        await self.node.forget_rounds()
        if not self.leaving:
            self.register()

    # ---- what this node says ---------------------------------------------------------------------
    def register(self) -> None:
        self.last_register = time.time()
        self.link.route("")  # registering is always direct: a relay forwards only for members it was given
        self.to_coord(MeshOp.register, self.node.register_body())

    def start_registering(self) -> None:
        self.first_register = time.time()
        self.register()

    def leave(self, reason: str) -> None:
        """A preemption notice: ranks stop at one agreed step (the drain), then the job re-forms without us.

        Bounded by --grace-period; a second signal, or no welcome yet, takes the fast path at once.
        """
        if self.leaving or not self.registered:
            self.depart(reason if not self.leaving else f"{reason} again: leaving at once")
            return
        self.leaving = True
        log.info("[%s] leaving gracefully (%s); up to %.0fs for the workers to stop at one step",
                 self.cfg.node_id, reason, self.cfg.grace_s)
        self.to_coord(MeshOp.leave, {"reason": reason, "graceful": True})
        self.life.spawn(self.depart_after_grace(reason))

    def hand_over(self, reason: str) -> None:
        """Our own coordinator's node drains like a member's (failover hands the role over), bounded by the grace."""
        self.leaving = True
        self.life.spawn(self.depart_after_grace(reason))

    def coordinator_here(self, now: float) -> None:
        """This daemon holds the coordinator now: our member registers with it, or, already joined, stays."""
        self.is_coordinator = True
        if self.registered:
            self.last_coord = now
        elif self.first_register:
            self.register()

    def coordinator_elsewhere(self) -> None:
        """Deposed: our member registers again, with whoever leads now."""
        self.is_coordinator = self.registered = False

    def follow_new_coordinator(self, now: float) -> None:
        """Register again with whoever we follow now (the same instance: a takeover costs no round)."""
        self.registered, self.last_coord = False, now
        if self.first_register:
            self.first_register = now  # --connect-timeout counts from here
            self.register()
        else:
            self.to_coord(MeshOp.announce, {})  # still warming up: the first round waits for us

    async def depart_after_grace(self, reason: str) -> None:
        await asyncio.sleep(self.cfg.grace_s)
        self.depart(f"{reason}; --grace-period {self.cfg.grace_s:g}s ran out before the drain ended")

    def depart(self, reason: str) -> None:
        """The fast path: tell the coordinator we are gone, stop the workers now, exit."""
        if self.departed:
            return
        self.leaving = self.departed = True
        self.to_coord(MeshOp.leave, {"reason": reason})
        self.exit_job(reason)

    def exit_job(self, reason: str) -> None:
        self.leaving = self.departed = True
        self.life.spawn(self.life.finish("stopped", f"left the job: {reason}", 0))

    def note_stall(self, now: float) -> None:
        """Time this daemon did not run is not the coordinator's silence: it is credited, as the coordinator
        credits its own stalls to the members.

        A loaded machine delays every beat a little (a late beat gives its lateness back); a stopped process
        (SIGSTOP, a paused VM) gets a fresh window, so a thawed member hears `unknown` and joins again instead
        of giving up on a coordinator that was there all along.
        """
        gap = now - self.last_beat if self.last_beat else 0.0
        if gap > 2 * self.cfg.heartbeat_s:
            log.warning("[%s] this daemon did not run for %.1fs (stopped or paused); checking in with the "
                        "coordinator", self.cfg.node_id, gap)
            self.last_coord = max(self.last_coord, now)
        elif gap > self.cfg.heartbeat_s:
            self.last_coord += gap - self.cfg.heartbeat_s
        self.last_beat = now

    def coordinator_gone(self, now: float) -> bool:
        """Silent past the loss limit (our own lateness credited, its queued frames read) and its connection
        dropped; or, connection held, silent for WEDGED_LIMITS times as long."""
        silent = now - self.last_coord
        if silent <= self.cfg.lost_after_s or self.link.backlog():
            return False
        return not self.link.link_up() or silent > WEDGED_LIMITS * self.cfg.lost_after_s

    def speak(self, now: float) -> None:
        """A heartbeat now: each interval, and on a new link at once (the coordinator learns the route from it)."""
        if self.registered and not self.departed:
            self.to_coord(MeshOp.hb, {**self.node.heartbeat_body(now), **self.link.state()})

    def leave_a_silent_relay(self, now: float) -> None:
        """Nothing from the coordinator through our relay for a loss limit, its link up all the while: the relay
        passes nothing on (cut off from the coordinator, or stalled). Straight to the coordinator, which names the
        next relay once it has judged this one."""
        if self.link.state().get("via") and now - self.last_coord > self.cfg.lost_after_s \
                and not self.link.backlog():
            log.warning("[%s] nothing from the coordinator through our relay for %.0fs; talking to it directly",
                        self.cfg.node_id, now - self.last_coord)
            self.link.route("")

    def registration_overdue(self, now: float) -> bool:
        """--connect-timeout bounds a start; a daemon that joined once (a thawed coordinator stepped down, a member
        told `unknown`) registers again for as long as its coordinator lives: on etcd for as long as it takes (the
        election names the next one), else while the coordinator is heard from within that timeout."""
        if not self.joined:
            return now - self.first_register > self.connect_timeout_s
        return not self.await_election and now - self.last_coord > self.connect_timeout_s

    def give_up_registering(self, now: float) -> None:
        if self.joined:
            self.coordinator_lost(now)
        else:
            self.life.fail_start(self.never_joined())

    def never_joined(self) -> str:
        """Why a start found no coordinator: no one answered, or what took the connection never completed the
        handshake (another program on the port, or keys that do not match)."""
        endpoint, limit = f"rendezvous endpoint {self.cfg.rdzv_host}:{self.cfg.rdzv_port}", self.connect_timeout_s
        if not self.link.foreign():
            return (f"{endpoint} did not answer within {limit:.0f}s; is the first elasticd of job "
                    f"'{self.cfg.job_id}' running on that host?")
        if self.cfg.keys_dir:
            return (f"{endpoint} took the connection but never completed the key handshake within {limit:.0f}s: the "
                    f"job's node key is not the one in --keys {self.cfg.keys_dir} (copy the job's keys folder), its "
                    "coordinator runs without --keys, or another program holds that port")
        return (f"{endpoint} took the connection but never answered as an elasticd within {limit:.0f}s: another "
                "program holds that port (choose another port for --rdzv-endpoint), or the job runs with --keys "
                "(pass its keys folder)")

    def coordinator_lost(self, now: float) -> None:
        message = (f"coordinator of job '{self.cfg.job_id}' at {self.cfg.rdzv_host}:{self.cfg.rdzv_port} "
                   f"stopped answering for {now - self.last_coord:.0f}s; the job cannot go on without it "
                   "(no coordinator HA without --rdzv-backend etcd): workers stopped")
        log.warning("[%s] %s", self.cfg.node_id, message)
        self.life.spawn(self.life.finish("lost", message, EXIT_COORDINATOR_LOST, message))

    def beat(self, now: float) -> None:
        """Once a heartbeat interval: retry registering, or send a heartbeat and watch the coordinator."""
        self.note_stall(now)
        if self.departed or (self.leaving and not self.registered):
            return
        if not self.registered:
            if not self.first_register:
                return  # still warming up
            if self.registration_overdue(now):
                self.give_up_registering(now)
            elif now - self.last_register >= 1.0:
                self.register()
            return
        self.speak(now)
        self.leave_a_silent_relay(now)
        if self.await_election:
            return  # elasticd/daemon/failover.py points us at whoever etcd elects next
        if not self.is_coordinator and self.coordinator_gone(now):
            self.coordinator_lost(now)
