"""A worker started before its round waits for its generation; a sharded one first builds FSDP2 once, off the stall."""

from __future__ import annotations

import logging
import warnings

import torch
import torch.distributed as dist

from trainer_shim.collection import freeze_imports
from trainer_shim.generation import GENERATION_WAIT_S, Generation
from trainer_shim.session import Session

log = logging.getLogger("trainer_shim")


class _Tiny(torch.nn.Module):
    """The kinds of layer a transformer shards: an embedding, a norm, linears in their own FSDP unit."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.norm = torch.nn.Embedding(8, 8), torch.nn.RMSNorm(8)
        self.layer = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.layer(self.norm(self.embed(tokens)))


def await_first(session: Session, sharded: bool) -> Generation:
    """Say that this worker waits (it holds no group yet), then wait for its generation, as long as its node keeps
    it (a standby node's spare may wait for hours: its daemon stops it). A sharded rank first warms FSDP2 up: the
    round that adds its node waits for this `waiting` hello, while the survivors still train."""
    if sharded:
        warm_sharding()
    freeze_imports(full=True)  # the warm-up's garbage too: this rank waits anyway
    session.rejoin(session.rank, 0, in_place=True, waiting=True)
    body = None
    while body is None:
        body = session.wait_generation(0, GENERATION_WAIT_S)  # again, as long as its node keeps it
    return Generation.from_body(body)


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
