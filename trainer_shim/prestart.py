"""A worker started before its round waits for its generation; a sharded one first builds FSDP2 once, off the stall."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from elasticd.wire.names import NEXT_WORLDS_ENV, REHEARSE_ENV
from trainer_shim.collection import freeze_imports
from trainer_shim.generation import GENERATION_WAIT_S, Generation
from trainer_shim.session import Session

log = logging.getLogger("trainer_shim")
REHEARSAL_ENV = "ELASTICD_REHEARSE"  # the user's: "0" never rehearses (a model whose memory is tight on its device)


class Rebuild:
    """The script's rebuild and its state's round trip, as a rehearsal runs them: `build(rank, world_size)`, then
    `load(read())`."""

    def __init__(self, build: Callable[[int, int], None], read: Callable[[], Any], load: Callable[[Any], None]) \
            -> None:
        self.build, self.read, self.load = build, read, load


class _Tiny(torch.nn.Module):
    """The kinds of layer a transformer shards: an embedding, a norm, linears in their own FSDP unit."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.norm = torch.nn.Embedding(8, 8), torch.nn.RMSNorm(8)
        self.layer = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.layer(self.norm(self.embed(tokens)))


def await_first(session: Session, rebuild: Rebuild | None) -> tuple[Generation, tuple[int, int] | None]:
    """Say that this worker waits (it holds no group yet), then wait for its generation, as long as its node keeps
    it (a standby node's spare may wait for hours: its daemon stops it). A sharded rank (`rebuild`) first warms
    FSDP2 up, and rehearses the script's rebuild where its daemon expects a world: the round that adds its node
    waits for this `waiting` hello, while the survivors still train. Returns the generation, and the world size and
    rank it rehearsed as, if it did (the rehearsal's model is garbage once the script rebuilds: a full collection
    frees it; DTensor's caches hold that rank's meshes: trainer_shim.mesh_caches)."""
    if rebuild is not None:
        warm_sharding()
    freeze_imports(full=True)  # the warm-up's garbage too: this rank waits anyway
    rehearsed = rehearse(rebuild, os.environ) if rebuild is not None else None  # after the freeze: not kept
    session.rejoin(session.rank, 0, in_place=True, waiting=True)
    body = None
    while body is None:
        body = session.wait_generation(0, GENERATION_WAIT_S)  # again, as long as its node keeps it
    return Generation.from_body(body), rehearsed


def warm_sharding() -> None:
    """FSDP2 once over a one-rank 1-D mesh and a 2-D (HSDP) one, on the CPU: built on meta, sharded per layer,
    materialized, an AdamW, its state read and loaded, a step. A newcomer's first `on_world` otherwise pays
    torch's lazy imports and first calls (0.4 s here) while the survivors wait. Best effort: on any error the
    real build pays them instead. The caller holds no process group; none is left behind, nor any RNG draw."""
    if dist.is_initialized():
        return
    try:
        from torch.distributed.device_mesh import init_device_mesh  # here: a torch without FSDP2 skips the warm-up

        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DTensor's notes on CPU meshes: this model is thrown away
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            for names in (("dp_shard",), ("dp_replicate", "dp_shard")):
                _step(init_device_mesh("cpu", (1,) * len(names), mesh_dim_names=names))
    except Exception as exc:  # a warm-up must never stop a worker
        log.debug("warm-up of FSDP2 skipped: %r", exc)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def rehearse(rebuild: Rebuild, env: Any) -> tuple[int, int] | None:
    """The script's rebuild once, before the round, in the world the daemon expects this node to join
    (REHEARSE_ENV; its ranks last): the real rebuild then finds DTensor's sharding rules for that mesh already
    worked out, and its model's code run once (on one quiet process here, 0.18 s of rebuild, state read and load
    took 0.044 s after it). Returns the world size and rank it rehearsed as, or None."""
    try:
        world, nproc = int(env.get(REHEARSE_ENV, "0") or 0), _local(env, "LOCAL_WORLD_SIZE", 1)
        rank = world - nproc + _local(env, "LOCAL_RANK", 0)
    except ValueError:  # not the daemon's numbers: no rehearsal
        return None
    return rehearse_as(rebuild, world, rank) if world >= nproc else None


def rehearse_next(rebuild: Rebuild, env: Any, world: int, rank: int) -> list[tuple[int, int]]:
    """At a job's start, before the first world: the script's rebuild once in each world one change from it
    (NEXT_WORLDS_ENV: one node more, one fewer, within --nnodes), at the rank this process would have there (its
    own; a node fewer and this rank past the end: a node below it left). Its first resize of each kind then finds
    that mesh's sharding rules worked out: the first optimizer step on a mesh never met costs 0.1 s for the titan
    example's 39 parameters here, 0.3 s with AdamW's foreach, and grows with the parameter count. Returns the
    worlds and ranks it rehearsed as."""
    try:
        nproc = _local(env, "LOCAL_WORLD_SIZE", 1)
    except ValueError:  # not the daemon's number: no rehearsal
        return []
    done = []
    for size in sorted(_sizes(env.get(NEXT_WORLDS_ENV, ""))):  # the largest world last: its smaller shards are held
        guess = rank if rank < size else rank - nproc
        if size != world and 0 <= guess < size and (rehearsed := rehearse_as(rebuild, size, guess)) is not None:
            done.append(rehearsed)
            gc.collect()  # the rehearsal before this one, which the script no longer holds (FSDP2's cycles)
    return done


def rehearse_as(rebuild: Rebuild, world: int, rank: int) -> tuple[int, int] | None:
    """The script's rebuild, state read and load once on a fake process group (collectives that do nothing) as
    `rank` of `world`. Best effort, like the warm-up: a wrong guess only warms less, and any error leaves the real
    rebuild to pay it all. No process group or RNG draw is left. Its model lives on until the script's next
    `on_world` replaces it, so the real build briefly holds both (REHEARSAL_ENV=0 where that does not fit). Returns
    (world, rank), or None."""
    if not 0 <= rank < world or dist.is_initialized() or os.environ.get(REHEARSAL_ENV) == "0":
        return None
    began = time.perf_counter()
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
            rebuild.build(rank, world)
            with _stepping() as optimizers:  # DCP's state round trip steps a fresh optimizer once
                rebuild.load(rebuild.read())
            rehearse_clipping(optimizers)
    except Exception as exc:  # a rehearsal must never stop a worker
        log.debug("rehearsal of world %d skipped: %r", world, exc)
        return None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    log.debug("rehearsed world %d as rank %d in %.3fs", world, rank, time.perf_counter() - began)
    return world, rank


@contextlib.contextmanager
def _stepping() -> Iterator[list[torch.optim.Optimizer]]:
    """The optimizers whose step runs meanwhile, once each, in order."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    seen: list[torch.optim.Optimizer] = []

    def stepping(optim: torch.optim.Optimizer, *_: Any) -> None:
        if optim not in seen:
            seen.append(optim)

    handle = register_optimizer_step_pre_hook(stepping)
    try:
        yield seen
    finally:
        handle.remove()


def rehearse_clipping(optimizers: list[torch.optim.Optimizer]) -> None:
    """The gradient clipping a torchtitan-style step runs after every backward, once on each rehearsed optimizer's
    sharded parameters with zero gradients (dropped after): the total norm, made whole, then each gradient scaled.
    DTensor works out a foreach op's sharding for its whole list of tensors, and the state round trip runs none of
    these: on a mesh never met, the titan variant's first clipping took 0.11 s against 0.0015 s once rehearsed (one
    quiet process here). Torch's default kernels and its foreach ones, which differ on a CPU. Best effort."""
    from torch.distributed.tensor import DTensor

    total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch 2.6 and newer, as torchtitan calls them
    scale = getattr(torch.nn.utils, "clip_grads_with_norm_", None)
    for optim in optimizers:
        params = [p for group in optim.param_groups for p in group["params"] if p.requires_grad]
        if total_norm is None or scale is None or not any(isinstance(p, DTensor) for p in params):
            continue
        try:
            with torch.no_grad():
                for param in params:
                    param.grad = torch.zeros_like(param)
            for foreach in (None, True):
                norm = total_norm([p.grad for p in params], foreach=foreach)
                scale(params, 1.0, norm.full_tensor() if isinstance(norm, DTensor) else norm, foreach=foreach)
        except Exception as exc:  # the rebuild's rehearsal stands; only the first clipping is left cold
            log.debug("rehearsal of gradient clipping skipped: %r", exc)
        finally:
            for param in params:
                param.grad = None


def _local(env: Any, name: str, default: int) -> int:
    return int(env.get(name, "") or default)


def _sizes(text: str) -> list[int]:
    """A comma-separated list of world sizes; what is not one is left out."""
    return [int(part) for part in text.split(",") if part.strip().isdigit() and int(part) > 0]


def _step(mesh: dist.DeviceMesh) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = _Tiny()
    fully_shard(model.layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            torch.nn.init.trunc_normal_(param, std=0.02)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state, optim_state = get_state_dict(model, optim)
    set_state_dict(model, optim, model_state_dict=state, optim_state_dict=optim_state)
    model(torch.zeros(2, 4, dtype=torch.long)).sum().backward()
    optim.step()
