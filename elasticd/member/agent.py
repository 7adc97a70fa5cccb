"""The node agent: registers with the coordinator, applies each round to the local workers, reports back."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from elasticd.job.config import STOP_SLACK_S, JobConfig, stop_barrier_s
from elasticd.member.beats import BeatDiff, PortPool
from elasticd.member.failures import failure_of, read_error_file
from elasticd.member.gpu import GpuSampler
from elasticd.member.in_place import InPlace
from elasticd.member.output_metrics import compile_pattern, parse_line
from elasticd.member.processes.spawner import Spawner
from elasticd.member.processes.workers import Worker, WorkerGroup
from elasticd.member.rank_reports import RankReports
from elasticd.member.store.round_store import RoundStore, StoreError
from elasticd.member.worker_output import WorkerOutput
from elasticd.wire.assignment import RoundAssignment, Welcome
from elasticd.wire.diagnosis import Failure, StackDump, blocked
from elasticd.wire.member_state import EventReport, ProgressReport, Register, Scheduler
from elasticd.wire.names import EventKind, MeshOp, NodeState
from elasticd.wire.worker_reports import RankStep

log = logging.getLogger("elasticd")
COLLECTIVE_HANG_WAIT_S = 2.0  # a rank hung in a collective waits this long for the stuck rank's node to report
ROUNDS_KEPT = 16  # rounds whose workers `logs` still finds in memory (older ones: by their log file)
ToCoordinator = Callable[[MeshOp, dict[str, Any]], None]
NodeEvent = Callable[..., None]  # (EventKind, **fields): a node-side event for the job log


class NodeAgent:
    """This node's workers: applies each round the coordinator sends, and reports what they do."""

    def __init__(self, cfg: JobConfig, host: str, to_coord: ToCoordinator, event: NodeEvent,
                 worker_env: dict[str, str]) -> None:
        self.cfg = cfg
        # The daemon swaps in a zygote-backed one at start (never with --no-python: cfg.zygote is off then).
        self.spawner = Spawner(cfg.python, None, no_python=cfg.no_python)
        self.round_store: RoundStore | None = None  # with --keys: each round's store is loopback-only (daemon.py)
        self.host = host
        self.to_coord = to_coord
        self.event = event
        self.worker_env = worker_env
        self.instance = uuid.uuid4().hex[:12]
        self.state: str = NodeState.registering
        self.reason = ""
        self.round_id = 0
        self.assignment = RoundAssignment(None)  # the newest round this node is in
        self.group: WorkerGroup | None = None
        self._round_lock = asyncio.Lock()
        self.endpoints: dict[str, str] = {}
        self.rank_reports = RankReports()  # filled by the worker channel (shim reports)
        self.drained_ranks: set[int] = set()
        self.drained_reported = False
        self.latest_round = 0  # the newest round assigned, even while an older one is still being applied
        self._exit_watch: asyncio.TimerHandle | None = None  # armed when a worker finished before its peers
        self._tasks: set[asyncio.Future[Any]] = set()
        self._go: dict[int, asyncio.Event] = {}  # round -> set when the coordinator says its workers may start
        self.reports: dict[str, ProgressReport] = {}  # this round's `round_progress` (stopped, spawned), to resend
        self.output_pattern = compile_pattern(cfg.metrics_from_output) if cfg.metrics_from_output else None
        self.gpu = GpuSampler(cfg.heartbeat_s)  # NVML read once per heartbeat for all workers
        self.beats = BeatDiff()  # what the coordinator already holds: heartbeats carry only the rest
        self.ports = PortPool()
        self.in_place = InPlace(self)  # in-place rounds: shim workers kept through membership changes
        self.groups: deque[WorkerGroup] = deque(maxlen=ROUNDS_KEPT)  # the newest rounds' workers, for `logs`
        self.output = WorkerOutput(cfg, lambda: self.groups)  # `logs` and `stacks`, answered here

    def pre_started(self, group: WorkerGroup) -> None:
        """Workers started before the round that adds this node (they wait for their generation): ours till then."""
        self.group = group

    def welcomed(self, role: str) -> None:
        """The coordinator took this node in, in `role` (active, or standby while the job is at its size)."""
        self.state = role

    async def forget_rounds(self) -> None:
        """The coordinator no longer knows this node: its workers stop, and its next round is new to it."""
        await self.stop_workers()
        self.round_id = 0

    def equip(self, spawner: Spawner, round_store: RoundStore | None) -> None:
        """The daemon's worker services are up: workers fork from its zygote, rounds' stores go through its tunnel."""
        self.spawner, self.round_store = spawner, round_store

    def bound(self, endpoints: dict[str, str], worker_env: dict[str, str]) -> None:
        """The daemon's sockets are bound: what `register` advertises, and what every worker's environment adds."""
        self.endpoints, self.worker_env = endpoints, worker_env

    def register_body(self) -> dict[str, Any]:
        self.beats.reset()  # a new record at the coordinator: the next heartbeat carries everything again
        cfg, endpoints = self.cfg, self.endpoints
        return Register(self.instance, self.host, cfg.nproc_per_node, cfg.node_rank, self.ports.current(),
                        endpoints.get("control", ""), endpoints.get("pub", ""), endpoints.get("store_tunnel", ""),
                        endpoints.get("relay", ""),
                        Scheduler.decode(cfg.scheduler, "scheduler") if cfg.scheduler else None).encode()

    def heartbeat_body(self, now: float) -> dict[str, Any]:
        """State every beat; ports, worker records and shim metrics only when the coordinator lacks them."""
        return self.beats.body({
            "instance": self.instance, "ports": self.ports.current(), "workers": self.workers_info(),
            "state": self.state, "round": self.round_id, "assigned": self.latest_round,
            "metrics": self.rank_reports.by_rank(self.round_id)}, now)

    def workers_info(self) -> list[dict[str, Any]]:
        """Worker records; with NVML each has `gpu` (null when on no GPU), without it the field is absent."""
        records = self.group.info() if self.group else []
        gpu = self.gpu.for_workers([r["pid"] for r in records if r["state"] == "running"]) if records else None
        return records if gpu is None else [{**r, "gpu": gpu.get(r["pid"])} for r in records]

    # ---- rounds -------------------------------------------------------------------------------
    async def apply_round(self, assignment: RoundAssignment) -> None:
        round_id = assignment.round
        self.ports.take(assignment.master_port)  # offered no more: a round's store listens there (here or not)
        if round_id is not None:
            self.supersede(round_id)
        async with self._round_lock:
            if round_id is not None and (round_id <= self.round_id or round_id < self.latest_round):
                if round_id == self.round_id:  # the coordinator asks again: our `stopped` did not reach it
                    self.report_again("stopped")
                return  # a stale or repeated assignment, or one a newer round already replaced
            if assignment.job_store_tunnel and self.round_store is not None:  # with --keys: through our relay
                store = await self.round_store.job_store(assignment.job_store_tunnel)
                assignment = dataclasses.replace(assignment, store=store)
            kept = await self.in_place.keep(round_id) if self.in_place.applies(assignment) else []
            # The old workers' `workers_stopped` rides on the progress report: one frame per node, not two.
            held: list[EventReport] | None = [] if round_id is not None else None
            stopped = await self.stop_workers(kept, held)  # what was not kept in place
            if round_id is None:
                self.state, self.reason = assignment.state, assignment.reason
                log.warning("[%s] %s: %s", self.cfg.node_id, self.state, self.reason)
                return
            self.begin_round(round_id, assignment)
            self.report("stopped", ProgressReport(round_id, stopped=stopped, events=held or []))
            if assignment.state != NodeState.running:
                self.state = assignment.state
                if assignment.prewarm:  # a standby of an in-place job: its workers wait, ready to join
                    job_store = f"{assignment.store}/{assignment.job_prefix}" if assignment.store else ""
                    await self.in_place.prestart(assignment.expected_world, job_store)  # its relay's, with --keys
                return
            await self.start_workers(round_id, assignment, kept)

    def supersede(self, round_id: int) -> None:
        """A round was assigned: the newest one so far, perhaps; an older round still waiting for `go` gives up."""
        self.latest_round = max(self.latest_round, round_id)
        for waiting, event in self._go.items():
            if waiting < round_id:
                event.set()  # wake an older round's wait: it is superseded

    def begin_round(self, round_id: int, assignment: RoundAssignment) -> None:
        """This node is in `round_id` now: nothing reported in it yet, and no straggler watch left from the last."""
        self.round_id, self.assignment = round_id, assignment
        self.rank_reports.clear()
        self.drained_ranks, self.drained_reported = set(), False
        self.reports = {}
        if self._exit_watch is not None:
            self._exit_watch.cancel()
            self._exit_watch = None

    async def start_workers(self, round_id: int, assignment: RoundAssignment, kept: list[Worker]) -> None:
        """The round's workers, once the coordinator says `go`: those kept in place join first, the rest spawn."""
        self.state = NodeState.running
        store_env = await self.open_store(round_id, assignment)  # while other nodes still stop their old ones
        if store_env is None:
            return
        # Kept workers belong to the new group at once: a newer round that supersedes this one stops them.
        on_line = self.on_worker_line if self.output_pattern else None
        group = self.group = WorkerGroup(self.cfg, round_id, assignment, {**self.worker_env, **store_env},
                                         self.on_worker_exit, self.spawner, on_line, kept)
        self.groups.append(group)
        if not await self.wait_for_go(round_id, in_place=assignment.in_place):
            return  # a newer round replaced this one while its old workers were being stopped
        self.in_place.publish(group, kept, assignment)  # the survivors join first: they wait on nothing
        try:
            await group.spawn()
        except OSError as exc:
            self.report_failure(None, f"could not start workers on node {self.cfg.node_id}: {exc}")
            return
        if self.group is not group:  # stopped while it spawned (the job ended, a newer round): nothing to report
            return
        started = event_body(EventKind.workers_started, round=round_id, ranks=assignment.ranks,
                             world_size=assignment.world_size, pids=[w.proc.pid for w in group.workers],
                             kept=[w.proc.pid for w in kept])
        self.report("spawned", ProgressReport(round_id, spawned=time.time(), events=[started]))

    async def prestart(self, welcome: Welcome) -> None:
        """A welcome that asks for hot workers: they start now, told where the job's store is (with --keys, through
        this node's relay; none where that fails: they only prepare less, trainer_shim/prepared.py)."""
        store = welcome.store
        if welcome.job_store_tunnel and self.round_store is not None:
            try:
                store = await self.round_store.job_store(welcome.job_store_tunnel)
            except (OSError, StoreError) as exc:
                log.warning("[%s] pre-started workers go without the job's store: %s", self.cfg.node_id, exc)
                store = ""
        await self.in_place.prestart(welcome.expected_world, f"{store}/{welcome.prefix}" if store else "")

    async def open_store(self, round_id: int, assignment: RoundAssignment) -> dict[str, str] | None:
        """The env that points workers at the round's store; {} without keys (rank 0 hosts it); None: failed."""
        if self.round_store is None:
            return {}
        try:
            return await self.round_store.open(round_id, assignment)
        except (OSError, StoreError) as exc:
            self.report_failure(None, f"could not open round {round_id}'s store on node {self.cfg.node_id}: {exc}")
            return None

    async def wait_for_go(self, round_id: int, in_place: bool = False) -> bool:
        """Start this round's workers only once every node's old ones are gone (the coordinator says go); longer
        than the coordinator's stop barrier (RoundTracker.stop_limit), which an in-place round lengthens."""
        event = self._go.setdefault(round_id, asyncio.Event())
        with contextlib.suppress(asyncio.TimeoutError):
            limit = stop_barrier_s(self.cfg.grace_s, in_place) + STOP_SLACK_S
            await asyncio.wait_for(event.wait(), limit)
        self._go.pop(round_id, None)
        return self.latest_round <= round_id

    def go(self, round_id: int) -> None:
        if round_id == self.round_id and "spawned" in self.reports:  # a `go` again: our `spawned` was lost
            self.report_again("spawned")
        self._go.setdefault(round_id, asyncio.Event()).set()

    def report(self, phase: str, report: ProgressReport) -> None:
        """A step of this round, kept until the next round: the mesh may drop it, the coordinator asks again."""
        self.reports[phase] = report
        self.to_coord(MeshOp.round_progress, report.encode())

    def report_again(self, phase: str) -> None:
        """Only a report older than the loss limit: a younger one is more likely queued than lost, and a
        busy coordinator asking again must not get a second copy of every member's report."""
        report = self.reports.get(phase)
        if report is None:
            return
        sent = report.stopped if phase == "stopped" else report.spawned
        if sent is not None and time.time() - sent > self.cfg.lost_after_s:
            self.to_coord(MeshOp.round_progress, report.encode())

    async def stop_workers(self, kept: list[Worker] | None = None, held: list[EventReport] | None = None) -> float:
        """Stop this round's workers; those `kept` in place (out of their group already) end the round too.
        Their `workers_stopped` event goes to `held` when given, else is sent."""
        group, self.group = self.group, None
        if group and (group.running or kept):
            await group.stop(self.cfg.grace_s)
            fields = {"round": group.round_id, "exit_codes": {w.rank: w.exit_code for w in group.workers},
                      "last_step": self.rank_reports.step_answer(group.round_id)["step"],  # goodput's redone work
                      **({"kept": [w.proc.pid for w in kept]} if kept else {})}
            if held is None:
                self.event(EventKind.workers_stopped, **fields)
            else:
                held.append(event_body(EventKind.workers_stopped, **fields))
        if self.round_store is not None:
            await self.round_store.close()  # the store goes with the round's workers
        return time.time()

    def on_worker_line(self, worker: Worker, text: str) -> None:
        """--metrics-from-output: a line that states a step or a loss is that rank's report."""
        assert self.output_pattern is not None
        fields = parse_line(self.output_pattern, text)
        now = time.time()
        if fields is not None and self.rank_reports.reads_output(worker.rank, self.round_id, now):  # shim's win
            step = fields.get("step", self.rank_reports.last_step(worker.rank))
            self.step_reported(RankStep(worker.rank, step, loss=fields.get("loss")), now)

    def step_reported(self, step: RankStep, now: float) -> None:
        """A rank's step (a shim `step`, or read from its output); its first in a round is the round's too."""
        if self.rank_reports.step(step, now):
            self.to_coord(MeshOp.first_step, {"round": self.round_id, "at": now, "step": step.step})

    def on_worker_exit(self, worker: Worker) -> None:
        self.in_place.gone(worker.proc.pid)
        group = self.group
        if worker.stopping or group is None or worker not in group.workers:
            return
        self.event(EventKind.worker_exited, round=group.round_id, rank=worker.rank, pid=worker.proc.pid,
                   exit_code=worker.exit_code)
        if worker.rank in self.drained_ranks:
            self.check_drained()  # it saved and said so: how its teardown ends is no failure
        elif worker.exit_code != 0:
            if not worker.failure_sent:
                self.send_failure(failure_of(worker, self.cfg.node_id, group.round_id))
        elif not group.running and all(w.exit_code == 0 for w in group.workers):
            self.to_coord(MeshOp.node_done, {"round": group.round_id})
        elif self._exit_watch is None:
            self._exit_watch = asyncio.get_running_loop().call_later(
                self.cfg.exit_timeout_s, lambda: self._background(self.stop_stragglers(group)))

    async def stop_stragglers(self, group: WorkerGroup) -> None:
        """Peers of a finished worker that never exit (a teardown deadlock) are stopped; the node is done."""
        if self.group is not group or not group.running:
            return
        self.event(EventKind.worker_exit_timeout, round=group.round_id, ranks=[w.rank for w in group.running],
                   timeout_s=self.cfg.exit_timeout_s)
        for worker in group.running:
            worker.stopping = True  # their work is over: how they die is no failure
        await group.stop(self.cfg.grace_s)
        self.to_coord(MeshOp.node_done, {"round": group.round_id})

    def _background(self, coro: Any) -> None:
        self._tasks.add(task := asyncio.ensure_future(coro))
        task.add_done_callback(self._tasks.discard)

    def check_drained(self) -> None:
        """Every local rank said `drained`, so its checkpoint is durable: no need to wait for the exits."""
        group = self.group
        if group is not None and not self.drained_reported and {w.rank for w in group.workers} <= self.drained_ranks:
            self.drained_reported = True
            self.to_coord(MeshOp.node_drained, {"round": group.round_id})

    async def kill_worker(self, rank: int) -> None:
        """A failure drill: SIGKILL one local worker, which the job then recovers from like any crash."""
        if self.group is not None and self.group.kill_worker(rank):
            self.event(EventKind.worker_killed, rank=rank, reason="operator drill")

    def check_recorded(self) -> None:
        """A running worker whose error file appeared (torch's @record) raised and is exiting: its failure goes now,
        with that error, not once its process is gone. A teardown can take seconds (CUDA, a loaded machine), and a
        peer blocked in a collective with it would meanwhile look hung, and be named the root cause."""
        group = self.group
        if group is None or self.state != NodeState.running:
            return
        for worker in group.running:
            if not (worker.stopping or worker.failure_sent) and worker.error_file.exists() \
                    and read_error_file(worker) is not None:  # None: still being written
                worker.failure_sent = True
                self.send_failure(failure_of(worker, self.cfg.node_id, group.round_id))

    def report_failure(self, worker: Worker | None, reason: str, hang: bool = False, rank: int | None = None) -> None:
        """A failure with no exit behind it (a spawn, a store, a lost process, a hang): its reason says what."""
        self.send_failure(Failure(self.cfg.node_id, worker.rank if worker else rank, self.round_id,
                                  pid=worker.proc.pid if worker else 0, at=time.time(), hang=hang, reason=reason))

    async def dump_stacks(self, worker: Worker) -> StackDump:
        return await self.output.dump(worker)

    def report_hangs(self, hung: dict[int, float]) -> None:
        """Ranks that made no step for --hang-timeout (rank -> seconds): this node's stacks first (where each hung),
        then the failures that stop them."""
        self._background(self._report_hangs(hung))

    async def _report_hangs(self, hung: dict[int, float]) -> None:
        group = self.group
        hung = {rank: silent for rank, silent in hung.items()  # a rank that raised is failing, not hung
                if not (group and any(w.rank == rank and w.failure_sent for w in group.workers))}
        if not hung:
            return
        dumps = {d.rank: d for d in await asyncio.gather(*(self.output.dump(w) for w in group.running))} \
            if group else {}
        dumped = sorted(d.rank for d in dumps.values() if d.text)  # the rest: `elasticd stacks` reads their last dump
        if dumps and all(in_collective(dumps[r].where) for r in hung if r in dumps):
            # Every hung rank here waits in a collective for another: the rank stuck on its own, on some node, is
            # the root cause, and its node reports without waiting. Ours wait; a round that replaced this one
            # meanwhile makes them its consequences, with nothing to say.
            await asyncio.sleep(COLLECTIVE_HANG_WAIT_S)
            if self.group is not group:
                return
        # A rank waiting in a collective waits for another: the one that is not is reported first, the root cause.
        for rank in sorted(hung, key=lambda r: in_collective(dumps[r].where) if r in dumps else True):
            dump = dumps.get(rank)
            note = dump.note if dump is not None else "its process is not this node's to signal"
            self.event(EventKind.worker_hung, rank=rank, silent_s=round(hung[rank], 1),
                       **({"stack": dump.body()} if dump is not None and dump.text else {}),
                       **({"stacks_note": note} if note else {}), stacks_of=dumped)
            where = dump.where if dump is not None else ""
            self.report_failure(None, f"worker rank {rank} on node {self.cfg.node_id} made no step for "
                                f"{hung[rank]:.1f}s (hang timeout {self.cfg.hang_timeout_s:.0f}s)"
                                f"{blocked(where, note)}", hang=True, rank=rank)
            self.in_place.end_hung(rank)

    def send_failure(self, failure: Failure) -> None:
        self.to_coord(MeshOp.worker_failed, {**failure.body(), "detected": failure.at or time.time()})

    async def end(self, state: str, reason: str) -> None:
        self.state, self.reason = NodeState.ending, reason
        await self.stop_workers()


def event_body(kind: EventKind, **fields: Any) -> EventReport:
    """A node event as the coordinator adopts it: from an `event` frame, or in `round_progress.events`."""
    return EventReport(kind, time.time(), fields)


def in_collective(where: str) -> bool:
    """A stack whose innermost frame is torch.distributed's: waiting for a peer rather than stuck on its own."""
    return where.startswith(("distributed_c10d.py", "c10d_logger.py"))
