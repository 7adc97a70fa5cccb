"""Generations without a daemon: processes leave one group and join the next; each receives the state it lacks.

The NCCL case runs where CUDA is (scripts/gpu_resize_check.sh): one rank per GPU, so one GPU runs worlds of one.
"""

from __future__ import annotations

import faulthandler
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed.tensor._random as dtensor_random
import torch.multiprocessing as mp
from support.spawned import spawned
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer_shim.elastic import Elastic
from trainer_shim.generation import Generation, NotArrived, arrive, join, leave, open_store, state_digest
from trainer_shim.heal import heal
from trainer_shim.noop import NullSession
from trainer_shim.peer_errors import lost_peer
from trainer_shim.state_paths import fill, flatten


def fresh(device: torch.device, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model and an Adam with no state yet (it is created lazily at the first step), different per seed. Its
    160 small layers (64 KB each, 31 MB with Adam's moments) reach a newcomer as bundled messages, into new memory
    for the moments; each sender sends more of them than it has staging buffers, so it reuses them."""
    torch.manual_seed(seed)
    deep = [torch.nn.Linear(128, 128) for _ in range(160)]
    model = torch.nn.Sequential(torch.nn.Linear(8, 128), *deep, torch.nn.BatchNorm1d(128), torch.nn.Linear(128, 1))
    model = model.to(device)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def member(proc: int, backend: str, store_addr: str, worlds: list[int], out: dict) -> None:
    device = torch.device("cuda", proc % max(1, torch.cuda.device_count())) if backend == "nccl" \
        else torch.device("cpu")
    if backend == "nccl":
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        torch.cuda.set_device(device)
    comm = device if backend == "nccl" else torch.device("cpu")
    store = open_store(store_addr, 30)
    model, opt = fresh(device, seed=proc)
    me = {"model": model, "opt": opt, "step": 0}  # what this process holds now

    def snapshot() -> dict:
        return {"model": me["model"].state_dict(), "opt": me["opt"].state_dict(), "step": me["step"]}

    def trained() -> dict:
        """What training makes equal on every rank (BatchNorm's running stats are each rank's own until DDP's
        next forward copies rank 0's)."""
        return {"params": dict(me["model"].named_parameters()), "opt": me["opt"].state_dict(), "step": me["step"]}

    seen = []
    for gen, world in enumerate(worlds, start=1):
        if proc >= world:
            if proc < max(worlds):  # out of this world: it comes back as a newcomer, with nothing trained
                me["model"], me["opt"] = fresh(device, seed=100 + gen)
                me["step"] = 0
            continue
        if gen == 3 and proc == 0 and world > 1:  # rank 0 was replaced (a crash): rank 1 is the freshest now
            me["model"], me["opt"] = fresh(device, seed=300)
            me["step"] = 0
        # A process out of the last generation waits here while the others train it: in a full suite on 2 cores
        # (torch 2.14's CUDA wheel) that outlasted the 60 s a daemon's worker waits.
        opened = join(Generation(gen, proc, world, store_addr, f"test/g{gen}"), backend, store, 30, wait_s=240)
        tensors: dict = {}
        skeleton = flatten(snapshot(), tensors)
        synced, filled = heal(me["step"], tensors, skeleton, None, comm, vouched=gen > 1)
        if filled:
            state = fill(synced.skeleton, filled)
            me["model"].load_state_dict(state["model"])
            me["opt"].load_state_dict(state["opt"])
        me["step"] = synced.step
        digests: list[str | None] = [None] * world
        dist.all_gather_object(digests, state_digest(trained()))
        seen.append((gen, synced.source, len(set(digests)), synced.received_bytes))
        ddp = DDP(me["model"], init_sync=False)
        for _ in range(2):  # each rank its own data: DDP keeps them identical only if they began identical
            me["opt"].zero_grad()
            x = torch.randn(4, 8, device=device) * (proc + 1)
            ddp(x).pow(2).mean().backward()
            me["opt"].step()
            me["step"] += 1
        del ddp
        leave(backend, False, opened)
    out[proc] = seen


@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="NCCL needs CUDA (scripts/gpu_resize_check.sh on a GPU machine)"))])
def test_every_generation_starts_bitwise_identical_from_the_freshest_rank(backend: str, store_addr: str) -> None:
    gpus = torch.cuda.device_count() if backend == "nccl" else 3
    worlds = [2, 3, 2, 3] if gpus >= 3 else [gpus] * 4  # NCCL: one rank per GPU
    seen = spawned(member, max(worlds), backend, store_addr, worlds)
    for proc, gens in seen.items():
        for gen, _, distinct, _ in gens:
            assert distinct == 1, f"generation {gen}: rank {proc} disagrees"
    if max(worlds) == 3:
        # The source is the lowest rank holding the highest step: rank 1 where rank 0 was replaced (generation 3);
        # proc 2 sat generation 3 out and came back in 4 with nothing, and took rank 0's state.
        assert {g: src for g, src, _, _ in seen[0]} == {1: 0, 2: 0, 3: 1, 4: 0}
        assert [g for g, _, _, _ in seen[2]] == [2, 4]
        # Only what a rank lacks moves: survivors holding the freshest step receive nothing; a newcomer the state.
        received = {(proc, g): nbytes for proc, gens in seen.items() for g, _, _, nbytes in gens}
        assert received[(1, 1)] > 0  # the first world: proc 1's own init is replaced by rank 0's
        assert received[(0, 2)] == received[(1, 2)] == 0 < received[(2, 2)]
        assert received[(1, 3)] == 0 < received[(0, 3)]  # proc 0 was replaced; proc 1 is the freshest
        assert received[(0, 4)] == received[(1, 4)] == 0 < received[(2, 4)]


HUNG_S = 60  # 3.3 s alone; a run that failed here under a whole suite's load had waited all of it


def crash_or_classify(proc: int, store_addr: str, out: dict) -> None:
    faulthandler.dump_traceback_later(HUNG_S - 10)  # a hang's stacks reach the failure's captured stderr
    try:
        classify(proc, store_addr, out)
    except Exception as exc:  # the test's failure then says why this rank reported nothing
        out[proc] = {"error": repr(exc)}
        raise


def classify(proc: int, store_addr: str, out: dict) -> None:
    store = open_store(store_addr, 30)
    join(Generation(1, proc, 2, store_addr, "test/lost"), "gloo", store, 5)
    ddp = DDP(torch.nn.Linear(8, 1))
    ddp(torch.randn(4, 8)).sum().backward()  # one step together
    if proc == 1:
        os._exit(0)  # a crash: no goodbye to its group
    errors = {}
    try:
        ddp(torch.randn(4, 8)).sum().backward()  # DDP's allreduce with the dead peer
    except RuntimeError as exc:
        errors["peer"] = lost_peer(exc)
    try:
        torch.ones(2) @ torch.ones(3)  # the script's own bug
    except RuntimeError as exc:
        errors["bug"] = lost_peer(exc)
    out[proc] = errors


def test_a_dead_peer_is_told_from_the_scripts_own_error(store_addr: str) -> None:
    """run_step heals in place only a lost peer; a bug in the script raises, as it would without the shim."""
    with mp.Manager() as manager:
        out = manager.dict()
        context = mp.start_processes(crash_or_classify, args=(store_addr, out), nprocs=2,
                                     start_method="spawn", join=False)
        context.processes[0].join(HUNG_S)
        seen = dict(out)
    codes = [p.exitcode for p in context.processes]
    for p in context.processes:
        p.kill()
    assert seen == {0: {"peer": True, "bug": False}}, f"exit codes {codes} (rank 1 exits 0 by design)"


def late_member(proc: int, store_addr: str, out: dict) -> None:
    """Rank 1 arrives long after the group's 1 s timeout: a newcomer's peers first finish their step."""
    store = open_store(store_addr, 1)
    if proc == 1:
        time.sleep(3)
    join(Generation(1, proc, 2, store_addr, "test/late"), "gloo", store, 1)
    total = torch.tensor([proc + 1])
    dist.all_reduce(total)
    out[proc] = int(total.item())


def test_a_rank_that_arrives_after_the_groups_timeout_still_joins(store_addr: str) -> None:
    assert spawned(late_member, 2, store_addr) == {0: 3, 1: 3}


def test_a_generation_whose_ranks_do_not_all_arrive_says_how_many_came(store_addr: str) -> None:
    store = open_store(store_addr, 5)
    with pytest.raises(NotArrived, match="generation 4: 1 of 3 ranks arrived within 0s"):
        arrive(Generation(4, 0, 3, store_addr, "test/absent"), store, wait_s=0.2)


def slow_builder(proc: int, store_addr: str, out: dict) -> None:
    """A sharded rank whose model build (`on_world`) outlasts the collectives' 1 s timeout: a newcomer's first
    build on a loaded host."""
    os.environ.update({"RANK": str(proc), "WORLD_SIZE": "2", "ELASTICD_STORE": store_addr,
                       "ELASTICD_STORE_PREFIX": "test/rebuilt", "ELASTICD_ROUND": "1"})
    me = {"w": torch.full((4,), float(proc)), "step": 0}

    def on_world(rank: int, world_size: int) -> None:
        if rank == 1:
            time.sleep(3)

    shim = Elastic(NullSession(proc), state_dict=lambda: dict(me), load_state_dict=me.update, on_world=on_world,
                   backend="gloo", timeout_s=1, sharded=True)
    out[proc] = shim.init()
    dist.destroy_process_group()


def test_a_sharded_rank_that_rebuilds_after_the_heals_timeout_still_heals(store_addr: str) -> None:
    assert spawned(slow_builder, 2, store_addr) == {0: 0, 1: 0}


def test_leaving_a_group_drops_dtensors_rng_tracker_with_its_mesh() -> None:
    """On CUDA the first random DTensor op of a process without a tracker broadcasts rank 0's RNG state over the
    world (`init_weights` in `on_world`): a survivor that kept the tracker of its old mesh would skip the broadcast
    that its newcomers make, and the next collective would hang. Every rank of a new world starts without one."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    dtensor_random._rng_tracker = object()  # type: ignore[assignment]  # what a CUDA job's first world left
    leave("gloo", False, set())
    assert dtensor_random._rng_tracker is None and not dist.is_initialized()
