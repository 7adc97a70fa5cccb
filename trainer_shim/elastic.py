"""In-place resizes for a training loop: the script says how to get and set its state and what to rebuild.

    elastic = Elastic(session, state_dict=get, load_state_dict=put, on_world=rebuild, sampler=sampler)
    elastic.init(step)                       # joins the first generation; state comes from the freshest rank
    while elastic.step < total:
        elastic.run_step(train_one_step)     # train_one_step(step); resizes in place between steps

Under elasticd, a membership change (join, drain, scale, leave, a peer's crash) keeps this process: at the
agreed step it leaves its process group, waits for the daemon's next generation, joins it, receives what it
lacks of the freshest state (trainer_shim.heal) and calls `on_world(rank, world_size)`. A sharded script
(FSDP2, HSDP: `sharded=True`) builds its model on the new mesh in `on_world`, which then runs first, and its
shards are healed into the new model. Without a daemon (plain torchrun, one process) it is a plain
`init_process_group` and a loop. docs/architecture.md, "Generations" and "Healing".
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

from elasticd.wire.names import NEXT_WORLDS_ENV, PRESTART_ENV
from trainer_shim.abort import watch
from trainer_shim.checkpoint import SaveResult
from trainer_shim.collection import collect, freeze_imports, held
from trainer_shim.data import ElasticSampler
from trainer_shim.generation import (
    DEFAULT_TIMEOUT_S,
    GENERATION_WAIT_S,
    Generation,
    NotArrived,
    abort,
    arrive,
    join,
    leave,
    open_store,
    sockets_now,
    subgroup_timeout,
)
from trainer_shim.heal import Healed, HealError, heal
from trainer_shim.heal_moves import MESSAGE_BYTES, touch
from trainer_shim.heal_plan import NOTHING
from trainer_shim.mesh_caches import MeshCaches
from trainer_shim.noop import NullSession
from trainer_shim.peer_errors import lost_in_save, lost_peer, one_line, sharded
from trainer_shim.phases import COLLECT, REBUILD, RESTORE, STATE, WAIT, Phases
from trainer_shim.prepared import Prepared, prepare, publish
from trainer_shim.session import Request, Session
from trainer_shim.staging import Staging
from trainer_shim.state_paths import fill, flatten
from trainer_shim.step_commit import StepCommit
from trainer_shim.step_fence import StepFence
from trainer_shim.step_timing import CollectiveWait

RESTART_WAIT_S = 120.0  # after a failed resize, how long the daemon has to replace this process


class _Stepper(Protocol):
    def __call__(self, step: int) -> None: ...


def _seed(seed: int, step: int, rank: int) -> int:
    return (seed * 1_000_003 + step * 1009 + rank) % (1 << 63)


class Elastic:
    """Keeps this worker's process through membership changes; falls back to a restart when it cannot."""

    def __init__(self, session: Session | NullSession, *, state_dict: Callable[[], Any],
                 load_state_dict: Callable[[Any], None], on_world: Callable[[int, int], None],
                 sampler: ElasticSampler | None = None, backend: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, seed: int = 0, in_place: bool = True,
                 sharded: bool = False, checkpoint_dir: str | None = None, keep: int = 2) -> None:
        self.session = session
        self.sharded, self.checkpoint_dir, self.keep = sharded, checkpoint_dir, keep
        self._held: tuple[int, dict[str, torch.Tensor], Any] | None = None  # a sharded rank's state before leaving
        self.last_heal: dict[str, Any] = {}  # what the last heal moved (the `joined` report's `heal`)
        self._vouched = False  # this process's state was healed in a world: equal to the other ranks'
        self._rehearsed = False  # a pre-started rank rehearsed its rebuild: that model is garbage after the first
        self._meshes = MeshCaches()  # a sharded rank's: the rank it had in each world size DTensor's caches saw
        self._leaving = False  # between leaving a group and joining the next: the daemon's abort is moot
        self._resize_pending = False  # a resize settled at the last boundary, acted on before the next step
        self._resize_asked: Request | None = None  # the `resize` request this boundary settled: its id, `all_stay`
        self._phases = Phases()  # where the last change's time went (the `joined` report's parts)
        self._step_end = time.time()  # when this rank's last step ended (the `joined` report's `last_step_at`)
        self.state_dict, self.load_state_dict, self.on_world = state_dict, load_state_dict, on_world
        self.sampler = sampler
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.timeout_s, self.seed = timeout_s, seed
        self.want_in_place = in_place
        self.in_place = False  # set by init(): a daemon, a job store and the script's consent
        self.rank, self.world_size, self.round, self.step = 0, 1, 0, 0
        self._committed: dict[str, int] | None = None  # the sampler's position at the last completed step
        self._store: dist.Store | None = None
        self._fence: StepFence | None = None  # this generation's: where each daemon request acts, agreed
        self._agreed: int | None = None  # the boundary the fence last settled
        self._vote: StepCommit | None = None  # this generation's, a sharded job's: every rank updates, or none
        self._stepping: int | None = None  # the step run_step has in flight
        self._update_hook: RemovableHandle | None = None
        self._opened: set[str] = set()  # the current group's sockets (severed on leaving)
        self._wait = CollectiveWait()  # watch(): this rank's wait for its peers, per step
        self._prepared: Prepared | None = None  # a pre-started newcomer's memory, touched, for its heal's new tensors
        self._size_key: str | None = None  # rank 0 of a data-parallel generation: publish the state's size here
        self._staging = Staging(MESSAGE_BYTES)  # its heals' buffers for many small pieces, kept
        self.local_device = torch.device("cpu")
        if self.backend == "nccl":
            # NCCL's default (3) tears the process down on an error: keep it, so it can leave and rejoin.
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
            self.local_device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.local_device)

    @property
    def comm_device(self) -> torch.device:
        return self.local_device if self.backend == "nccl" else torch.device("cpu")

    # -- joining ---------------------------------------------------------------------------------------
    def init(self, step: int = 0) -> int:
        """Join the first generation and take the freshest state (a newcomer needs no checkpoint)."""
        env = os.environ
        gen = Generation.from_env(env)
        self.step = step
        self._commit()
        self.in_place = self.want_in_place and isinstance(self.session, Session) and gen is not None
        if (self.in_place or env.get(PRESTART_ENV)) and isinstance(self.session, Session):
            self.session.abort_signal = watch(self._abort)
            if self.sharded:  # every optimizer's update, however the script or its framework calls it
                self._update_hook = register_optimizer_step_pre_hook(self._before_update)
        started = time.time()
        if self.in_place:
            freeze_imports()
        if (self.in_place or env.get(PRESTART_ENV)) and self.comm_device.type == "cpu":
            self._staging.warm(touch)  # before its first heal, which every later world starts with
        if env.get(PRESTART_ENV) and isinstance(self.session, Session):
            from trainer_shim.prestart import Rebuild, await_first  # FSDP2's imports: only a pre-started rank's

            rebuild = Rebuild(self.on_world, self.state_dict, self.load_state_dict) if self.sharded else None
            if not self.sharded:  # before saying it waits: the round that adds it waits for this, not the job
                self._prepared = prepare(env, self._snapshot, self.comm_device, touch)
            gen, rehearsed = await_first(self.session, rebuild)  # early, for a round that adds this node
            if rehearsed is not None:
                self._meshes.enter(*rehearsed)
                self._rehearsed = True
            self.in_place = True
        elif gen is not None and self.in_place and self.sharded and env.get(NEXT_WORLDS_ENV):
            self._rehearse_next(gen)
        if gen is not None:
            self._store = open_store(gen.store, self.timeout_s)
            try:
                self._opened = join(gen, self.backend, self._store, self.timeout_s)
                self._open_fence(gen)
            except NotArrived as exc:  # its daemon restarts it: a clear line, not a traceback
                raise SystemExit(f"elastic: rank {gen.rank}: {exc}") from None
            self.round = gen.round
        elif "WORLD_SIZE" in env and "MASTER_ADDR" in env:
            dist.init_process_group(self.backend)
        else:  # a bare `python script.py`: a one-process group keeps the DDP code path identical
            self.backend = "gloo"
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        ready = time.time()
        try:
            self._rebind(gen)
        except (HealError, NotArrived) as exc:  # no state to start from, or peers that never rebuilt: a line
            raise SystemExit(f"elastic: rank {self.rank}: {exc}") from None
        if isinstance(self.session, Session):
            self._joined(self.session, started=started, group_ready=ready)
        return self.step

    def _rehearse_next(self, gen: Generation) -> None:
        """A job's first workers, before their first world: the worlds one change away, rehearsed (their sharding
        rules worked out) while the job starts rather than in its first resizes' stalls (trainer_shim/prestart.py)."""
        from trainer_shim.prestart import Rebuild, rehearse_next

        rebuild = Rebuild(self.on_world, self.state_dict, self.load_state_dict)
        for world, rank in rehearse_next(rebuild, os.environ, gen.world_size, gen.rank):
            self._meshes.enter(world, rank)
            self._rehearsed = True

    def _joined(self, session: Session, **timeline: float) -> None:
        """This rank is in its generation with the freshest state: the `joined` report, with where its time went."""
        if self.in_place:
            session.rejoin(self.rank, self.round, in_place=True)
        session.joined(self.round, self.step, self.in_place, {**timeline, "synced": time.time(),
                                                              **self._phases.report()}, self.last_heal)

    @held()
    def _rebind(self, gen: Generation | None) -> None:
        """After joining: receive what this rank lacks of the freshest state, re-fit the sampler, reseed; the
        script's rebuild comes last, or first for a sharded script (its model lives on the new mesh, and the
        heal waits until every rank has rebuilt: a newcomer's first build can outlast the heal's timeout)."""
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self._phases = Phases()
        healed, state = self._heal_sharded(gen) if self.sharded else self._heal_replicated()
        if state is not None:
            with self._phases.timed(RESTORE):
                self._restore(state)
        self.step = int(state["step"]) if state is not None else healed.step
        if self.sampler is not None:
            self.sampler.set_world(self.rank, self.world_size)
        torch.manual_seed(_seed(self.seed, self.step, self.rank))
        if not self.sharded:
            self._world()
            self._free_old_world()
        self._vouched = True

    def _free_old_world(self) -> None:
        """After the rebuild, a survivor's old world (or a newcomer's rehearsal of it) freed at once: FSDP2's
        cycles, and a script with collection off."""
        self._phases.add(COLLECT, collect() if self._vouched or self._rehearsed else 0.0)
        self._rehearsed = False

    def _world(self) -> None:
        """The script's rebuild; the sockets it opens (its subgroups') are this generation's to sever."""
        before = sockets_now()
        if self.sharded:  # before the script builds: no mesh of another rank of this world may come from a cache
            self._meshes.enter(self.world_size, self.rank)
        with self._phases.timed(REBUILD), subgroup_timeout(self.timeout_s):
            self.on_world(self.rank, self.world_size)
        self._opened |= sockets_now() - before

    def _heal_replicated(self) -> tuple[Healed, dict[str, Any] | None]:
        """Data parallel: a rank holding the freshest step keeps its state; the others receive it whole."""
        tensors: dict[str, torch.Tensor] = {}
        with self._phases.timed(STATE):
            skeleton = flatten(self._snapshot(), tensors)
        healed, filled = heal(self.step, tensors, skeleton, None, self.comm_device, self._vouched, self._prepared,
                              self._staging)
        self._prepared = None
        self.last_heal = healed.report(None)
        return healed, fill(healed.skeleton, filled) if filled else None

    def _heal_sharded(self, gen: Generation | None) -> tuple[Healed, dict[str, Any]]:
        """The script's rebuild on the new mesh; then each rank's new shards from its own old ones and from the
        ranks holding the rest, or the newest checkpoint, resharded, when some rows are held by no live rank (a
        lost node with no replica)."""
        self._world()
        # The new model's state, which the heal fills, read before waiting for the slowest rank's rebuild: a
        # fresh optimizer's state is made then (a step of zeros), which that wait hides.
        target: dict[str, torch.Tensor] = {}
        with self._phases.timed(STATE):
            structure = flatten(self._snapshot(), target)
        if gen is not None and self._store is not None:
            with self._phases.timed(WAIT):
                arrive(gen, self._store, stage="rebuilt", meanwhile=self._free_old_world)
            self._phases.add(WAIT, -self._phases.seconds.get(COLLECT, 0.0))  # the collection ran inside that wait
        if self._held is None:  # a new process: its fresh model is step 0's only if there is no checkpoint
            fresh = not (self.checkpoint_dir and sharded().list_sharded(self.checkpoint_dir))
            self._held = (self.step if fresh else NOTHING, target if fresh else {}, structure)
        step, held, skeleton = self._held
        self._held = None
        healed, filled = heal(step, held, skeleton, target, self.comm_device, self._vouched, staging=self._staging)
        if not healed.missing:
            self.last_heal = healed.report(None)
            return healed, fill(healed.skeleton, {**target, **filled})
        reason = "no live rank holds any state" if healed.missing == ["*"] else \
            f"rows of {len(healed.missing)} tensors are held by no live rank (a lost shard with no replica)"
        state = self._load_checkpoint(reason)
        self.last_heal = healed.report(f"{reason}: loaded checkpoint step {state['step']}, resharded to world "
                                       f"{self.world_size}")
        return healed, state

    def _load_checkpoint(self, reason: str) -> dict[str, Any]:
        state = self._checkpoint_state()
        if not self.checkpoint_dir or sharded().load_sharded(state, self.checkpoint_dir) is None:
            raise HealError(f"{reason}, and no checkpoint in {self.checkpoint_dir or '(no checkpoint_dir)'}")
        state["sampler"] = state["sampler"] or None
        return state

    def _hold(self, gather: bool) -> None:
        """Before a sharded rank leaves: keep its shards (no copy). `gather` (a graceful change where a rank
        leaves): a shard no other rank holds (no replica) is first gathered whole on every rank, so that the ranks
        leaving take nothing away."""
        tensors: dict[str, torch.Tensor] = {}
        skeleton = flatten(self._snapshot(), tensors)
        if gather:
            tensors = sharded().full_shards(tensors)
        self._held = (self.step, tensors, skeleton)

    def _checkpoint_state(self) -> dict[str, Any]:
        return {**self._snapshot(), "sampler": self._committed or {}}

    def save(self, request_id: str | None = None) -> SaveResult | None:
        """Collective: the sharded state, the sampler's position, the step and seed, saved with DCP to
        `checkpoint_dir`; what a heal falls back to, resharded, when a shard was lost with no replica. A peer
        lost during the save heals in place like one lost in a step (the save is dropped): None."""
        if not self.checkpoint_dir:
            raise ValueError("Elastic.save needs checkpoint_dir")
        session = self.session if isinstance(self.session, Session) else None
        dcp = sharded()
        try:
            return dcp.save_sharded(self._checkpoint_state(), self.checkpoint_dir, self.step, self.keep, session,
                                    request_id)
        except (RuntimeError, dcp.CheckpointException) as exc:
            if not (self.in_place and lost_in_save(exc)):
                raise
            error = one_line(exc)
        self._resize(error)
        return None

    def _snapshot(self) -> dict[str, Any]:
        return {"user": self.state_dict(), "sampler": self._committed, "step": self.step, "seed": self.seed}

    def _restore(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["user"])
        self.seed = int(state["seed"])
        if self.sampler is not None and state["sampler"] is not None:
            self.sampler.load_state_dict(state["sampler"])
            self._committed = self.sampler.state_dict()

    def _commit(self) -> None:
        if self.sampler is not None:
            self._committed = self.sampler.state_dict()

    # -- the loop --------------------------------------------------------------------------------------
    def run_step(self, fn: _Stepper) -> int:
        """Run `fn(step + 1)` until that step completes; it is committed, and returned.

        A collective error in `fn` (a peer died) loses only that step's work: the sampler goes back, the rank
        leaves its group, rejoins the next generation and runs the step again there, as a newcomer's first step,
        so that what the script does where this returns (a save: collectives) runs in one world. Any other
        exception is raised: the script's own bug is not healed in place.
        """
        while True:
            while self._resize_pending or self._resize_due():
                self._resize(None)
            error = self._attempt(fn)
            if error is None:
                break
            if self._vote is not None and self._vote.applied == self.step + 1:
                self._completed()  # every rank applied it before the loss (a collective of the script's after it)
            elif self.sampler is not None and self._committed is not None:
                self.sampler.load_state_dict(self._committed)  # the step in flight is trained again
            self._resize(error)
        self._completed()
        if self._size_key is not None and self._store is not None:  # for a pre-started newcomer (prepared.py)
            publish(self._store, self._size_key, self._snapshot)
            self._size_key = None
        # Settled now, before the script's should_checkpoint; acted on at the next run_step (or close), so that
        # what the script does at this boundary (a save, an eval: collectives) runs in the world every rank
        # shares. A resize here would take the survivors into a world whose newcomers skip this boundary.
        self._resize_pending = self._resize_due()
        return self.step

    def _attempt(self, fn: _Stepper) -> str | None:
        """One try at the next step: None when it completed, else why a peer is gone."""
        self._stepping = self.step + 1
        try:
            fn(self.step + 1)
        except RuntimeError as exc:
            if not (self.in_place and lost_peer(exc)):
                raise  # a bug in the script ends its process: the restart path, charged, with its traceback
            return one_line(exc)  # the traceback's frames (and what they hold) go with the except block
        finally:
            self._stepping = None
        return None

    def _completed(self) -> None:
        self.step += 1
        self._step_end = time.time()
        self._commit()

    def _resize_due(self) -> bool:
        """At a step boundary: settle, the same on every rank, where each request acts; then whether a resize
        acts here. Once per boundary, before the next step (and before the script's should_checkpoint)."""
        session = self.session
        if not (self.in_place and isinstance(session, Session)):
            return False
        if self._fence is not None and self._agreed != self.step:
            session.agree(self.step, self._fence)
            self._agreed = self.step
        if not session.should_resize(self.step):
            return False
        self._resize_asked = session.last_request  # a checkpoint taken at this boundary must not stand for it
        return True

    def _open_fence(self, gen: Generation) -> None:
        """A generation joined: its own fence, and every request still held settled again in it."""
        if self._store is not None and isinstance(self.session, Session):
            self._fence, self._agreed = StepFence(self._store, gen.prefix), None
            if self.sharded:
                self._vote = StepCommit(self._store, gen.prefix, gen.rank, gen.world_size, self.timeout_s)
            self.session.unfence()
            self._size_key = gen.job_prefix if gen.rank == 0 and not self.sharded else None

    @held()  # no automatic collection mid-change: one started on one rank stalls every rank
    def _resize(self, error: str | None) -> None:
        session = self.session
        assert isinstance(session, Session) and self._store is not None
        asked, self._resize_asked = (self._resize_asked if error is None else None), None
        rid = asked.request_id if asked else None
        self._leaving = True
        self._resize_pending = False  # any leave serves the one settled at the boundary (a crash in its save too)
        if self.sharded:  # a join keeps every rank: each keeps its own shards, none gathers what has no replica
            self._hold(gather=error is None and not (asked and asked.all_stay))
        leave(self.backend, error is not None, self._opened)
        # Where this rank's stall began (the `resize` event's parts): its last completed step's end, so that the
        # boundary's agreement and what the script did there count, and after a crash the step lost in flight.
        last_step_at = self._step_end
        session.left_group()
        session.left(self.step, rid, error)
        body = session.wait_generation(self.round, GENERATION_WAIT_S)
        if body is None:
            raise SystemExit(f"elastic: no new generation within {GENERATION_WAIT_S:.0f}s after leaving round "
                             f"{self.round}")
        gen = Generation.from_body(body)
        self.round = gen.round
        try:
            self._opened = join(gen, self.backend, self._store, self.timeout_s)
            self._open_fence(gen)
            ready = time.time()
            self._rebind(gen)
        except Exception as exc:  # a callback, the broadcast, the group's init: the daemon restarts us instead
            session.resize_failed(gen.round, one_line(exc))
            leave(self.backend, True, self._opened)
            self._await_restart(gen.round)
        self._leaving = False
        self._joined(session, last_step_at=last_step_at, group_ready=ready)

    def _await_restart(self, round_id: int) -> None:
        """The coordinator answers a failed resize with a restart round, whose first act stops this process."""
        time.sleep(RESTART_WAIT_S)  # a signal's handler (the daemon's stop) still runs during it
        raise SystemExit(f"elastic: resize to round {round_id} failed and no restart came")

    def _abort(self) -> None:
        """The daemon says a peer is gone (trainer_shim.abort, on its thread): fail a collective blocked on it."""
        if not self._leaving:  # a generation's abort ends it: its vote's flag is never cleared
            if self._vote is not None:
                self._vote.aborted.set()
            abort(self.backend, self._opened)

    def _before_update(self, *_: Any) -> None:
        """An optimizer is about to apply the step in flight: first every rank votes (trainer_shim.step_commit)."""
        if self._stepping is not None and self._vote is not None:
            self._vote.before_update(self._stepping)

    def watch(self, ddp: DistributedDataParallel) -> None:
        """Time this rank's wait in `ddp`'s gradient allreduce, reported with each step: the coordinator names a
        node whose ranks make the others wait (a straggler). Call it in `on_world` on each new DDP."""
        ddp.register_comm_hook(None, self._wait.hook)
        if isinstance(self.session, Session):
            self.session.add_metrics(self._wait.take)

    def close(self) -> None:
        if self._update_hook is not None:
            self._update_hook.remove()
        if self._resize_pending:  # the last step's boundary: the newcomers wait for this rank's state
            self._resize(None)
        if dist.is_initialized():
            dist.destroy_process_group()
