"""Heal a generation: each rank receives exactly the rows of the freshest state it lacks, from every rank holding them.

docs/architecture.md, "Healing". Any torch.distributed world (no daemon): each rank says which block of each tensor
it holds (a DTensor's shard, or a plain tensor whole) at which step and which it wants; every rank computes the same
plan (trainer_shim.heal_plan), and the pieces move point to point into the wanting rank's own tensors
(trainer_shim.heal_moves).
"""

from __future__ import annotations

import math
import pickle
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from trainer_shim.collection import held as collection_held
from trainer_shim.heal_moves import bundled, move
from trainer_shim.heal_plan import NOTHING, Block, Offer, Piece, Settled, Summary, block, digest64, settle
from trainer_shim.prepared import Prepared
from trainer_shim.staging import Staging


class HealError(RuntimeError):
    """The freshest state cannot be put together: no rank holds some rows and there is nothing to fall back to."""


@dataclass
class Healed:
    """What a heal did on this rank: the freshest step, where its non-tensor state came from, what moved."""

    step: int
    source: int
    skeleton: Any  # the source's state with every tensor replaced by its path (a `Slot`)
    received_bytes: int = 0
    sent_bytes: int = 0
    senders: int = 0
    seconds: float = 0.0
    plan_s: float = 0.0  # the offers' exchange, the plan and the source's structure
    transfer_s: float = 0.0  # the rows' moving (and the new memory's touching)
    missing: list[str] = field(default_factory=list)  # paths with rows no live rank holds at the freshest step
    prepared_bytes: int = 0  # of received_bytes: into memory touched before (trainer_shim.prepared)

    def report(self, fallback: str | None) -> dict[str, Any]:
        """What the `joined` report carries (its `heal`); `fallback`: why the state came from a checkpoint."""
        return {"received_bytes": self.received_bytes, "sent_bytes": self.sent_bytes, "senders": self.senders,
                **{k: round(getattr(self, k), 4) for k in ("seconds", "plan_s", "transfer_s")}, "fallback": fallback,
                "prepared_bytes": self.prepared_bytes}


Blocks = dict[tuple[Any, ...], Block]  # a heal's blocks by (shape, dtype), or a DTensor's by (its spec's identity,
# local shape) and by (shape, local shape, dtype, its mesh's identity, placements)


def block_of(t: torch.Tensor, blocks: Blocks | None = None) -> tuple[torch.Tensor, Block]:
    """A tensor's local data and the block of the global tensor it is. A DTensor may be sharded along one dim.
    `blocks`: a heal's cache of the blocks (a parameter and its two moments share one, as do a model's same-shaped
    layers: computing a DTensor's costs ~30 us, and even its lookup by parts was 6.5 us a tensor). A mesh is keyed
    by its identity: hashing its contents cost more than the rest of the lookup, and the heal holds every mesh."""
    cache = blocks if blocks is not None else {}
    if not isinstance(t, DTensor):
        local = t.detach() if t.requires_grad else t  # a state's tensors come detached: no new object each
        key: tuple[Any, ...] = (t.shape, t.dtype)
        found = cache.get(key)
        if found is None:
            found = cache[key] = block(tuple(t.shape), t.dtype, 0, 0, t.shape[0] if t.dim() else 1)
        return local, found
    try:  # what `to_local` returns under `heal`'s no_grad, without its call: half of this lookup's time
        local = t._local_tensor
    except AttributeError:  # a torch that renamed it
        local = t.to_local()
    local = local.detach() if local.requires_grad else local
    spec = t._spec  # its fields directly: DTensor's properties for them cost a third of the lookup
    same = (id(spec), local.shape)  # sharding propagation caches its specs: a model's same-shaped parameters and
    found = cache.get(same)  # their optimizer states share one object under FSDP2, and this skips hashing it
    if found is None:
        key = (spec.shape, local.shape, local.dtype, id(spec.mesh), spec.placements)
        found = cache.get(key)
        if found is None:
            found = cache[key] = _dtensor_block(t, local)
        cache[same] = found
    return local, found


def _dtensor_block(t: DTensor, local: torch.Tensor) -> Block:
    shape = tuple(t.shape)
    offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)[1]
    split = [d for d in range(len(shape)) if local.shape[d] != shape[d]]
    if len(split) > 1:
        raise HealError(f"a DTensor sharded along {len(split)} dims ({t.placements}) cannot be healed by rows")
    if not shape:
        return block(shape, t.dtype, 0, 0, 1)
    dim = split[0] if split else next((p.dim for p in t.placements if isinstance(p, Shard)), 0)
    return block(shape, t.dtype, dim, int(offset[dim]), int(offset[dim]) + int(local.shape[dim]))


def replicated(t: torch.Tensor) -> bool:
    """Some other rank holds the same rows: a plain tensor (data parallel), or a DTensor with a replicate dim."""
    if not isinstance(t, DTensor):
        return True
    mesh = t.device_mesh
    return any(isinstance(p, Replicate) and mesh.size(i) > 1 for i, p in enumerate(t.placements)) \
        or all(not p.is_shard() for p in t.placements)


# -- the whole heal -------------------------------------------------------------------------------------
@torch.no_grad()  # it only copies rows: no autograd (a DTensor's `to_local` is then a plain attribute read)
@collection_held()  # a full collection on one rank (115 ms in a bench process here) would stall every rank
def heal(held_step: int, held: Mapping[str, torch.Tensor], skeleton: Any, wants: Mapping[str, torch.Tensor] | None,
         comm_device: torch.device, vouched: bool = True, prepared: Prepared | None = None,
         staging: Staging | None = None) -> tuple[Healed, dict[str, torch.Tensor]]:
    """Collective. `held`: this rank's tensors by path at `held_step` (plain tensors are whole: data parallel;
    DTensors their shard), `skeleton` the structure they came in; `vouched`: held in a world with the others.
    `wants`: the tensors to fill (a sharded rank's new shards), or None for a data-parallel rank, which wants
    what it lacks. Returns the outcome and the tensors by path that now hold the freshest state, empty where
    this rank's own `held` already does. When no rank at the freshest step is vouched for (a job's first world),
    the lowest holder of each row is its only source, so that every rank ends equal. `prepared`: memory touched
    before (trainer_shim.prepared) for the new tensors of a rank that lacks some, where they fit; `staging`: this
    process's buffers for messages of many small pieces (trainer_shim.staging), fresh ones where it is None."""
    start = time.perf_counter()
    rank = dist.get_rank()
    blocks: Blocks = {}
    have = {p: block_of(t, blocks) for p, t in held.items()}
    wanted = {p: block_of(t, blocks) for p, t in (wants or {}).items()}
    mine = Offer(held_step if held else NOTHING, vouched, {p: b for p, (_, b) in have.items()},
                 None if wants is None else {p: b for p, (_, b) in wanted.items()})
    offers = _offers(mine, comm_device)  # None where every rank can heal from its own rows
    settled = Settled.alone(mine, rank) if offers is None else settle(offers, rank)
    top = _structure(settled, offers, skeleton, have, comm_device)
    result = Healed(settled.step, settled.source, top[0], missing=settled.missing)
    planned = time.perf_counter()
    result.plan_s = result.seconds = planned - start
    if settled.missing:
        return result, {}
    pieces, full, asks = settled.pieces, settled.full, settled.asks
    incoming: list[Piece] = []  # none where every rank heals from its own rows
    if offers is not None:  # rows into new memory last: its receiver touches it while the rest arrives
        pieces.sort(key=lambda p: offers[p.dst].fresh(p.path, full[p.path]))  # type: ignore[union-attr]
        incoming = [p for p in pieces if p.dst == rank and bundled(p)]
    device_of = top[1].__getitem__ if top[1] is not None else lambda p: have[p][0].device.type
    filled, ready = _targets(asks[rank], wants or {}, held, device_of, comm_device, incoming, prepared) \
        if asks[rank] else ({}, set())
    # a tensor filled whole (its own, or new) is the whole block, cut along the source's dim
    into = {p: wanted[p] if p in wanted else (t, asks[rank][p]) for p, t in filled.items()}
    # rows received into new memory (none where every rank heals from its own rows)
    new = {p for p in filled if mine.fresh(p, full[p]) and p not in ready} if offers is not None else set()
    result.prepared_bytes = sum(filled[p].numel() * filled[p].element_size() for p in ready)
    result.received_bytes, result.sent_bytes, result.senders = move(pieces, rank, have, into, new, comm_device,
                                                                       staging)
    done = time.perf_counter()
    result.transfer_s, result.seconds = done - planned, done - start
    return result, filled


def _offers(mine: Offer, comm_device: torch.device) -> list[Offer | None] | None:
    """Every rank's offer, or None where every rank can heal from its own rows. The first all-gather carries each
    rank's summary, its offer's pickled size and digest; only where some rank needs the others' offers does a second
    carry them (all_gather_object's two collectives, with the summary riding on the first). Alike offers (a
    data-parallel world's survivors; an HSDP replica's ranks alike in every other replica) are sent and unpickled
    once, by the lowest rank holding one, and their ranks share the one object, which the plan looks up once: at
    256 ranks and 1,332 tensors, unpickling and planning every rank's copy took 0.2 s a rank."""
    payload = pickle.dumps(mine)
    digest = digest64(payload)
    rows = [torch.empty(6, dtype=torch.int64, device=comm_device) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, torch.tensor([*mine.summary().row(), len(payload), digest], dtype=torch.int64,
                                       device=comm_device))
    seen = [r.tolist() for r in rows]
    if Summary.self_sufficient([Summary(int(s), bool(v), bool(c), int(d)) for s, v, c, d, _, _ in seen]):
        return None
    first: dict[tuple[int, int], int] = {}  # (size, digest) -> the lowest rank with such an offer: it sends it
    for rank, row in enumerate(seen):
        first.setdefault((row[4], row[5]), rank)
    size = max(key[0] for key in first)
    ours = payload if first[(len(payload), digest)] == dist.get_rank() else b""
    buf = torch.frombuffer(bytearray(ours) + bytes(size - len(ours)), dtype=torch.uint8)
    bufs = [torch.empty(size, dtype=torch.uint8, device=comm_device) for _ in seen]
    dist.all_gather(bufs, buf.to(comm_device))
    alike = {key: pickle.loads(bufs[rank][:key[0]].cpu().numpy().tobytes()) for key, rank in first.items()}
    return [alike[(row[4], row[5])] for row in seen]


def _structure(settled: Settled, offers: list[Offer | None] | None, skeleton: Any,
               have: Mapping[str, tuple[torch.Tensor, Block]], comm_device: torch.device) -> list[Any]:
    """The source's structure and its tensors' device types by path, broadcast where some rank needs them: a
    newcomer, a rank behind, any rank not vouched for at the freshest step. A vouched rank at that step trained in
    the source's world and holds the same structure: where every rank is one (a drain, a leave), nobody waits for
    a broadcast, and the devices are this rank's own (None: looked up where asked, not listed for every tensor).
    (Sent with the offers, it saved 7-15 ms at 1,000 tensors, but an all-gather pads every slot to the largest.)"""
    if settled.missing or offers is None or all(o is None or (o.vouched and o.step == settled.step) for o in offers):
        return [skeleton, None]
    source = dist.get_rank() == settled.source
    top = [skeleton, {p: t.device.type for p, (t, _) in have.items()}] if source else [None, None]
    dist.broadcast_object_list(top, src=settled.source, device=comm_device)
    return top


def _targets(asks: Mapping[str, Block], wants: Mapping[str, torch.Tensor], held: Mapping[str, torch.Tensor],
             device_of: Callable[[str], str], comm_device: torch.device, incoming: list[Piece],
             prepared: Prepared | None = None) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Where this rank's rows go: its new shard, its own tensor of the same shape (received in place), or a
    new tensor on the device the source's was on (CUDA tensors on this rank's device); and the paths of those
    new tensors that lie in `prepared` memory (touched already)."""
    out: dict[str, torch.Tensor] = {}
    fresh: dict[str, tuple[Block, torch.device]] = {}
    cpu = torch.device("cpu")
    for path, want in asks.items():
        if path in wants:
            out[path] = wants[path]
            continue
        own = held.get(path)
        if own is not None and not isinstance(own, DTensor) and own.shape == want.shape and own.dtype == want.dtype:
            out[path] = own
            continue
        fresh[path] = (want, comm_device if device_of(path) == "cuda" else cpu)
    made, ready = _allocate(fresh, incoming, prepared)
    return {**out, **made}, ready


def _allocate(fresh: Mapping[str, tuple[Block, torch.device]], incoming: list[Piece], prepared: Prepared | None) \
        -> tuple[dict[str, torch.Tensor], set[str]]:
    """New tensors (touched by `move`). Those a bundle fills whole are views of one buffer per bundle, in its
    order: the bundle is received straight into them, with no staging buffer and no copy out (a newcomer's
    hundreds of small tensors cost what one tensor of their bytes does)."""
    runs: dict[tuple[int, torch.dtype, torch.device], list[str]] = {}
    for piece in incoming:
        want, device = fresh.get(piece.path, (None, None))
        if want is not None and device is not None and piece.dtype != torch.bool \
                and (piece.lo, piece.hi) == (0, want.shape[want.dim] if want.shape else 1):
            runs.setdefault((piece.src, piece.dtype, device), []).append(piece.path)
    out: dict[str, torch.Tensor] = {}
    ready: set[str] = set()  # in prepared memory
    for (_, dtype, device), paths in runs.items():
        sizes = [math.prod(fresh[p][0].shape) for p in paths]
        flat, touched = _empty((sum(sizes),), dtype, device, prepared)
        out.update({p: part.view(fresh[p][0].shape) for p, part in zip(paths, flat.split(sizes), strict=True)})
        if touched:
            ready.update(paths)
    for path, (want, device) in fresh.items():
        if path not in out:
            out[path], touched = _empty(want.shape, want.dtype, device, prepared)
            if touched:
                ready.add(path)
    return out, ready


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, prepared: Prepared | None) \
        -> tuple[torch.Tensor, bool]:
    """New memory, and whether it is touched: the prepared memory's next piece where it fits, else untouched."""
    made = prepared.empty(shape, dtype, device) if prepared is not None else None
    return (made, True) if made is not None else (torch.empty(shape, dtype=dtype, device=device), False)
