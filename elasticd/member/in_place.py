"""A node's side of an in-place round: keep its live shim workers (same PIDs), re-rank them, fork only the missing.

docs/architecture.md, "Generations". The node agent calls `keep` where it would stop its workers and `publish`
where it would only spawn; the worker channel feeds `on_hello`, `on_left`, `on_joined`, `on_failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any, Protocol

from elasticd.job.config import LEAVE_SLACK_S, JobConfig
from elasticd.member.processes.spawner import Spawner
from elasticd.member.processes.workers import Worker, WorkerGroup, signal_worker
from elasticd.wire.assignment import RoundAssignment
from elasticd.wire.diagnosis import StackDump
from elasticd.wire.heal_report import Heal
from elasticd.wire.member_state import ProgressReport
from elasticd.wire.names import JOB_STORE_ENV, PRESTART_ENV, REHEARSE_ENV, EventKind, MeshOp, NodeState, WorkerOp
from elasticd.wire.protocol import new_id
from elasticd.wire.record import Record
from elasticd.wire.worker_reports import Hello, Joined, JoinFailed, LeftGroup
from elasticd.wire.worker_requests import Generation, Resize

log = logging.getLogger("elasticd")
SendToWorker = Callable[[int, WorkerOp, Record], bool]  # (pid, op, body) -> sent


class Agent(Protocol):
    """What this needs of the node agent (elasticd/member/agent.py), which owns it."""

    cfg: JobConfig
    group: WorkerGroup | None
    drained_ranks: set[int]
    state: str
    worker_env: dict[str, str]
    spawner: Spawner

    def check_drained(self) -> None: ...
    def event(self, kind: EventKind, **fields: Any) -> None: ...
    def report_failure(self, worker: Worker | None, reason: str, hang: bool = False) -> None: ...
    def to_coord(self, op: MeshOp, body: dict[str, Any]) -> None: ...
    def on_worker_exit(self, worker: Worker) -> None: ...
    def pre_started(self, group: WorkerGroup) -> None: ...
    async def dump_stacks(self, worker: Worker) -> StackDump: ...


class InPlace:
    """A node's in-place rounds: which live workers stay, their new ranks, and the generation they join."""

    def __init__(self, node: Agent) -> None:
        self.node = node
        self.send: SendToWorker = lambda _pid, _op, _body: False  # reach_workers: the worker channel's
        self.capable: set[int] = set()  # pids whose hello said they resize in place (trainer_shim.Elastic)
        self.left: dict[int, LeftGroup | Hello] = {}  # pid -> its `left` (or waiting `hello`), until it joins again
        self.joined: dict[int, Joined] = {}  # pid -> its `joined` in the current round
        self.failed_round = 0  # the last round whose failure was reported (one report per round)
        self.abort_signals: dict[int, int] = {}  # pid -> the signal that aborts its group (its `hello` said)
        self.resizing = False  # between an in-place round's arrival and its workers' publication

    def reach_workers(self, send: SendToWorker) -> None:
        """The worker channel, once it is up: how a request reaches one worker process."""
        self.send = send

    # -- what the workers say ------------------------------------------------------------------------
    def on_hello(self, hello: Hello) -> None:
        if hello.in_place:
            self.capable.add(hello.pid)
            if hello.abort_signal is not None:
                self.abort_signals[hello.pid] = hello.abort_signal
        if hello.waiting:  # pre-started: out of any group, like a survivor that has left
            self.left[hello.pid] = hello
            self.say_warm()

    def say_warm(self) -> None:
        """Every pre-started worker waits, ready: the change that adds this node may go."""
        group = self.node.group
        if group is not None and group.round_id == 0 and {w.proc.pid for w in group.running} <= self.left.keys():
            self.node.to_coord(MeshOp.warm, {})

    async def prestart(self, expected_world: int, job_store: str = "") -> None:
        """Start this node's workers before the round that adds it: they load, then wait for their generation;
        `expected_world` (0: unknown) is the world the coordinator expects that to be, which a sharded script's
        rebuild rehearses meanwhile (trainer_shim/prestart.py); `job_store` (HOST:PORT/PREFIX, or ""), where a
        data-parallel one reads the state's size, to touch memory for it meanwhile (trainer_shim/prepared.py)."""
        if self.node.group is not None:  # up already; a new coordinator asks again, and hears they are warm
            self.say_warm()
            return
        nproc = self.node.cfg.nproc_per_node
        placeholder = RoundAssignment(0, ranks=list(range(nproc)), world_size=nproc, group_rank=0, group_world_size=1)
        env = {**self.node.worker_env, PRESTART_ENV: "1"}
        env.update({REHEARSE_ENV: str(expected_world)} if expected_world else {})
        env.update({JOB_STORE_ENV: job_store} if job_store else {})
        group = WorkerGroup(self.node.cfg, 0, placeholder, env, self.node.on_worker_exit, self.node.spawner)
        self.node.pre_started(group)
        try:
            await group.spawn()
        except OSError as exc:
            log.warning("[%s] could not pre-start workers: %s", self.node.cfg.node_id, exc)

    def gone(self, pid: int) -> None:
        """A worker exited: what it said goes with it (its pid may come back as another process)."""
        self.capable.discard(pid)
        self.left.pop(pid, None)
        self.joined.pop(pid, None)
        self.abort_signals.pop(pid, None)

    def end_hung(self, rank: int) -> None:
        """A hung in-place worker is stopped at once: its peers, blocked in a collective with it, then fail at
        once and heal in place (otherwise they would wait for their group's timeout). The restart path stops
        it too, only later. Its exit is reported as any exit is; the coordinator takes it for an echo."""
        group = self.node.group
        for worker in group.running if group else []:
            if worker.rank == rank and worker.proc.pid in self.capable:
                signal_worker(worker.proc.pid, signal.SIGKILL)

    def abort(self, pid: int) -> None:
        """A worker that may be blocked in a collective with a lost peer: its group is aborted now (the shim's
        abort signal, to that process alone) instead of at the group's timeout (trainer_shim/abort.py)."""
        sig = self.abort_signals.get(pid)
        if sig is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def ready(self) -> bool:
        """Every live worker of this node can resize in place (the step agreement's `in_place`)."""
        group = self.node.group
        return group is not None and bool(group.running) and all(w.proc.pid in self.capable for w in group.running)

    def on_left(self, left: LeftGroup) -> None:
        self.left[left.pid] = left
        if not left.error:
            self.node.drained_ranks.add(left.rank)  # out of the group at the agreed step: the node's part is done
            self.node.check_drained()
            return
        self.node.event(EventKind.worker_left, round=left.round, rank=left.rank, pid=left.pid, step=left.step,
                        error=left.error)
        if not self.resizing and self.node.state == NodeState.running:  # a peer died: heal in place
            self.node.report_failure(None, f"worker rank {left.rank} on node {self.node.cfg.node_id} lost its "
                                     f"process group at step {left.step}: {left.error}")

    def on_joined(self, joined: Joined) -> None:
        group = self.node.group
        if group is None or joined.round != group.round_id:
            return
        self.joined[joined.pid] = joined
        pids = {w.proc.pid for w in group.workers}
        if pids and pids <= self.joined.keys():
            mine = [self.joined[p] for p in pids]
            last = max(mine, key=lambda j: j.synced or 0.0)  # the stall ends with it: its parts add up to it
            heals = [j.heal for j in mine if j.heal is not None]
            last_steps = [j.last_step_at for j in mine if j.last_step_at is not None]
            self.node.to_coord(MeshOp.round_progress, ProgressReport(
                group.round_id, in_place=all(j.in_place for j in mine), group_ready=last.group_ready,
                synced=last.synced, rebuild_s=last.rebuild_s, collect_s=last.collect_s, state_s=last.state_s,
                wait_s=last.wait_s, restore_s=last.restore_s, last_step_at=min(last_steps, default=None),
                heal=Heal.merged(heals, last.heal) if heals else None).encode())

    def on_failed(self, failed: JoinFailed) -> None:
        self.capable.discard(failed.pid)  # it waits to be replaced: no later round keeps it
        round_id = failed.round or 0
        if round_id <= self.failed_round:
            return
        self.failed_round = round_id
        reason = f"rank {failed.rank} on node {self.node.cfg.node_id}: {failed.reason}"
        self.node.to_coord(MeshOp.resize_failed, {"round": round_id, "reason": reason})

    # -- the round ---------------------------------------------------------------------------------------
    def applies(self, assignment: RoundAssignment) -> bool:
        return assignment.in_place and assignment.state == NodeState.running and self.node.group is not None

    async def keep(self, round_id: int | None) -> list[Worker]:
        """Survivors out of their old group (asked now if the agreed step did not do it); released from it."""
        group = self.node.group
        assert group is not None
        self.resizing = True
        survivors = [w for w in group.running if w.proc.pid in self.capable]
        for worker in survivors:
            if worker.proc.pid not in self.left:  # a crash or a loss: nobody agreed a step; leave at once
                self.send(worker.proc.pid, WorkerOp.resize, Resize(new_id(), round=round_id))
                self.abort(worker.proc.pid)
        deadline = time.monotonic() + self.node.cfg.grace_s + LEAVE_SLACK_S
        while time.monotonic() < deadline and any(w.exit_code is None and w.proc.pid not in self.left
                                                  for w in survivors):
            await asyncio.sleep(0.005)
        kept = [w for w in survivors if w.exit_code is None and w.proc.pid in self.left]
        await self.not_left([w for w in survivors if w.exit_code is None and w not in kept],
                            self.node.cfg.grace_s + LEAVE_SLACK_S)
        group.release(kept)
        return kept

    async def not_left(self, stuck: list[Worker], waited_s: float) -> None:
        """Workers that never left their group (they are replaced, their state with them): where each was stuck,
        from its stack taken now, in a `worker_not_left` event and this node's log."""
        for dump in await asyncio.gather(*(self.node.dump_stacks(w) for w in stuck)):
            log.warning("[%s] worker rank %d (pid %d) did not leave its group within %.0fs; it is replaced%s",
                        self.node.cfg.node_id, dump.rank, dump.pid, waited_s, dump.blocked())
            self.node.event(EventKind.worker_not_left, rank=dump.rank, pid=dump.pid, waited_s=round(waited_s, 1),
                            **({"stack": dump.body()} if dump.text else {}),
                            **({"stacks_note": dump.note} if dump.note else {}))

    def publish(self, group: WorkerGroup, kept: list[Worker], assignment: RoundAssignment) -> None:
        """Tell each kept worker its place in the new generation; newcomers read theirs from their environment."""
        self.joined = {}
        for worker in kept:
            self.left.pop(worker.proc.pid, None)
            self.send(worker.proc.pid, WorkerOp.generation, Generation(
                round=group.round_id, rank=worker.rank, world_size=assignment.world_size, local_rank=worker.local_rank,
                group_rank=assignment.group_rank, group_world_size=assignment.group_world_size, store=assignment.store,
                prefix=assignment.prefix))
        self.resizing = False
