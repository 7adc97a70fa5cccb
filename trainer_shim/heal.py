"""Heal a generation: each rank receives exactly the rows of the freshest state it lacks, from every rank holding them.

docs/architecture.md, "Healing". Any torch.distributed world (no daemon): each rank says which block of each tensor
it holds (a DTensor's shard, or a plain tensor whole) at which step and which it wants; every rank computes the same
plan (trainer_shim.heal_plan), and the pieces move point to point into the wanting rank's own tensors.
"""

from __future__ import annotations

import math
import os
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
from trainer_shim.heal_plan import NOTHING, Block, Offer, Piece, Settled, Summary, block, digest64, settle
from trainer_shim.prepared import Prepared
from trainer_shim.staging import RECEIVE, SEND, SLOTS, Staging

SMALL_BYTES = 1 << 20  # pieces under this between two ranks travel together (a model's many norms)
BUNDLE_BYTES = 4 << 20  # in messages of about this size
MESSAGE_BYTES = BUNDLE_BYTES + SMALL_BYTES  # the largest such message: a staging buffer's kept size
TOUCH_THREADS = 8  # at most this many threads zero a newcomer's new memory


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


Blocks = dict[tuple[Any, ...], Block]  # a heal's blocks by (shape, dtype), or a DTensor's by (shape, local shape,
# dtype, its mesh's identity, placements)


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
    local = t.to_local()  # under `heal`'s no_grad: the plain local tensor, not autograd's Function
    local = local.detach() if local.requires_grad else local
    key = (t.shape, local.shape, t.dtype, id(t.device_mesh), t.placements)
    found = cache.get(key)
    if found is None:
        found = cache[key] = _dtensor_block(t, local)
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


# -- moving the rows ------------------------------------------------------------------------------------
def _rows(local: torch.Tensor, block: Block, lo: int, hi: int) -> torch.Tensor:
    flat = local.reshape(1) if not block.shape else local
    return flat.narrow(block.dim, lo - block.lo, hi - lo)


def _copy_own(held: tuple[torch.Tensor, Block], into: tuple[torch.Tensor, Block], piece: Piece) -> None:
    """A rank's own rows where its new tensor wants them, none where that is the same memory; a piece that is
    both tensors whole is not cut (a survivor's every tensor in data parallel, or in HSDP)."""
    (src, have), (dst, want) = held, into
    if not have.lo == want.lo == piece.lo or not have.hi == want.hi == piece.hi:
        src, dst = _rows(src, have, piece.lo, piece.hi), _rows(dst, want, piece.lo, piece.hi)
    if src.data_ptr() != dst.data_ptr():
        dst.copy_(src)


def _wire(t: torch.Tensor, comm_device: torch.device) -> torch.Tensor:
    t = t if t.device == comm_device else t.to(comm_device)
    t = t.contiguous()
    return t.view(torch.uint8) if t.dtype == torch.bool else t  # gloo moves no bool tensors


def move(pieces: list[Piece], me: int, held: Mapping[str, tuple[torch.Tensor, Block]],
         into: Mapping[str, tuple[torch.Tensor, Block]], new: set[str], comm_device: torch.device,
         staging: Staging | None = None) -> tuple[int, int, int]:
    """Run this rank's part of the plan: (received, sent, senders). Every send and the receives into existing
    tensors are posted at once; the tensors in `new` (memory never touched) are zeroed meanwhile, which costs
    their page faults while the wire is busy instead of inside the receive, and their receives follow. Small
    pieces between two ranks go together per dtype (`SMALL_BYTES`), in messages of about `BUNDLE_BYTES` tagged
    after the others: a sender copies the next message together while this one is on the wire, a receiver copies
    one out while the next arrives, each in `staging`'s buffers (fresh ones where it is None)."""
    posts = _Posts(comm_device, staging or Staging(MESSAGE_BYTES))
    bundles: dict[tuple[int, int, torch.dtype], list[Piece]] = {}
    moves = 0  # a move's tag is its place among the plan's moves, which every rank lists alike (copies: its own)
    for piece in pieces:
        if piece.src == piece.dst:
            if piece.src == me:
                _copy_own(held[piece.path], into[piece.path], piece)
            continue
        tag = moves = moves + 1
        if _bundled(piece):  # every rank groups alike: the tags agree
            bundles.setdefault((piece.src, piece.dst, piece.dtype), []).append(piece)
        elif piece.src == me:
            posts.send([_rows(*held[piece.path], piece.lo, piece.hi)], piece.dst, tag, piece.nbytes)
        elif piece.dst == me:
            posts.receive([_rows(*into[piece.path], piece.lo, piece.hi)], piece.src, tag, piece.nbytes,
                          later=piece.path in new and comm_device.type != "cuda")
    messages = [(src, dst, chunk) for (src, dst, _), group in bundles.items() for chunk in _chunks(group)]
    for tag, (src_rank, dst_rank, chunk) in enumerate(messages, start=moves + 1):
        nbytes = sum(p.nbytes for p in chunk)
        if me == src_rank:
            posts.send([_rows(*held[p.path], p.lo, p.hi) for p in chunk], dst_rank, tag, nbytes)
        elif me == dst_rank:
            posts.receive([_rows(*into[p.path], p.lo, p.hi) for p in chunk], src_rank, tag, nbytes,
                          later=comm_device.type != "cuda" and all(p.path in new for p in chunk))
    works = dict(zip([id(op.tensor) for op in posts.now], _start(posts.now, comm_device), strict=True))
    if posts.later:
        touch([into[path][0] for path in sorted(new)])
        works.update(zip([id(op.tensor) for op in posts.later], _start(posts.later, comm_device), strict=True))
    for buf, parts in posts.staged:  # grouped (NCCL): in order of arrival, each copied out as the next arrives
        works.pop(id(buf)).wait()
        _scatter(buf, parts)
    posts.pump()
    for work in [*works.values(), *posts.sending]:
        work.wait()
    return posts.received, posts.sent, len(posts.senders)


def _chunks(group: list[Piece]) -> list[list[Piece]]:
    """A bundle's pieces in messages of about BUNDLE_BYTES each, in order."""
    out: list[list[Piece]] = [[]]
    size = 0
    for piece in group:
        if out[-1] and size + piece.nbytes > BUNDLE_BYTES:
            out.append([])
            size = 0
        out[-1].append(piece)
        size += piece.nbytes
    return out


@dataclass
class _Copied:
    """A message copied together before it is sent, or received into a buffer and copied out (over gloo)."""

    ring: str  # staging.SEND or staging.RECEIVE
    parts: list[torch.Tensor]
    peer: int
    tag: int
    buf: torch.Tensor | None = None
    work: Any = None


class _Posts:
    """One rank's sends and receives of a heal, before they are started; counts what they move. Over gloo a send
    starts as soon as it is posted; its messages copied together or apart go through `pump`."""

    def __init__(self, comm_device: torch.device, staging: Staging) -> None:
        self.comm_device = comm_device
        self.eager = comm_device.type != "cuda"  # NCCL needs its point-to-point calls grouped: started together
        self.staging = staging
        self.now: list[dist.P2POp] = []
        self.later: list[dist.P2POp] = []  # receives into new memory, after it is touched
        self.sending: list[Any] = []  # sends already started (eager)
        self.staged: list[tuple[torch.Tensor, list[torch.Tensor]]] = []  # grouped: (buffer, where its parts go)
        self.copied: list[_Copied] = []  # eager: in tag order, for `pump`
        self.received = self.sent = 0
        self.senders: set[int] = set()

    def send(self, parts: list[torch.Tensor], peer: int, tag: int, nbytes: int) -> None:
        wire = [_wire(t, self.comm_device) for t in parts]
        self.sent += nbytes
        if len(wire) > 1 and self.eager:
            self.copied.append(_Copied(SEND, wire, peer, tag))
            return
        flat = wire[0] if len(wire) == 1 else torch.cat([t.reshape(-1) for t in wire])
        if self.eager:
            self.sending.append(dist.isend(flat, peer, tag=tag))
        else:
            self.now.append(dist.P2POp(dist.isend, flat, peer, tag=tag))

    def receive(self, parts: list[torch.Tensor], peer: int, tag: int, nbytes: int, later: bool) -> None:
        self.received += nbytes
        self.senders.add(peer)
        buf = _back_to_back(parts, self.comm_device)  # straight into the destination where it can
        if buf is None and self.eager:
            self.copied.append(_Copied(RECEIVE, parts, peer, tag))
            return
        if buf is None:
            wire = torch.uint8 if parts[0].dtype == torch.bool else parts[0].dtype
            buf = torch.empty(sum(t.numel() for t in parts), dtype=wire, device=self.comm_device)
            self.staged.append((buf, parts))
        (self.later if later else self.now).append(dist.P2POp(dist.irecv, buf, peer, tag=tag))

    def pump(self) -> None:
        """The messages copied together or apart, in tag order, `SLOTS` in flight per direction, each slot's buffer
        reused once its message is done. Every rank takes them in the plan's order and waits only for an earlier
        one, so the earliest unfinished message is always posted at both ends: two ranks that each send the other
        more messages than there are slots (a reshard's many small shards) cannot wait on each other."""
        flight: dict[str, list[_Copied]] = {SEND: [], RECEIVE: []}
        turns = dict.fromkeys(flight, 0)
        for msg in self.copied:
            ring = flight[msg.ring]
            if len(ring) == SLOTS:
                _finish(ring.pop(0))
            slot, turns[msg.ring] = turns[msg.ring] % SLOTS, turns[msg.ring] + 1
            one = msg.parts[0]
            size = sum(t.numel() for t in msg.parts)
            msg.buf = self.staging.buffer(msg.ring, slot, size * one.element_size()).view(_on_wire(one.dtype))
            if msg.ring == SEND:
                msg.work = dist.isend(torch.cat([t.reshape(-1) for t in msg.parts], out=msg.buf), msg.peer,
                                      tag=msg.tag)
            else:
                msg.work = dist.irecv(msg.buf, msg.peer, tag=msg.tag)
            ring.append(msg)
        for msg in [*flight[SEND], *flight[RECEIVE]]:
            _finish(msg)


def _finish(msg: _Copied) -> None:
    msg.work.wait()  # once only: a second wait on a gloo send waits for a send that never comes
    if msg.ring == RECEIVE:
        assert msg.buf is not None
        _scatter(msg.buf, msg.parts)


def _on_wire(dtype: torch.dtype) -> torch.dtype:
    return torch.uint8 if dtype == torch.bool else dtype


def _back_to_back(parts: list[torch.Tensor], comm_device: torch.device) -> torch.Tensor | None:
    """One flat view over the parts where they lie back to back in one buffer (one tensor; a newcomer's new
    tensors, allocated so by `_allocate`), to receive straight into; None where they do not."""
    first = parts[0]
    if first.dtype == torch.bool or first.device != comm_device:
        return None
    storage, at = first.untyped_storage().data_ptr(), first.data_ptr()
    for part in parts:
        if not part.is_contiguous() or part.data_ptr() != at or part.untyped_storage().data_ptr() != storage:
            return None
        at += part.numel() * part.element_size()
    return first.as_strided((sum(t.numel() for t in parts),), (1,), first.storage_offset())


def _scatter(buf: torch.Tensor, parts: list[torch.Tensor]) -> None:
    """A received flat buffer's contents into its destinations, in order."""
    for part, chunk in zip(parts, buf.split([t.numel() for t in parts]), strict=True):
        part.copy_((chunk.view(torch.bool) if part.dtype == torch.bool else chunk).view(part.shape))


def touch(tensors: list[torch.Tensor]) -> None:
    """Zero new memory with every core this once (a worker runs one intra-op thread): its page faults are most of
    a newcomer's heal on a small machine. New tensors that fill a buffer of their own (`_allocate`'s) are zeroed
    as that one buffer: a thousand small zero_ calls cost more than their bytes."""
    regions: dict[int, set[tuple[int, int]]] = {}  # per storage, the distinct spans (a tied tensor counts once)
    for t in tensors:
        regions.setdefault(t.untyped_storage().data_ptr(), set()).add((t.data_ptr(), t.numel() * t.element_size()))
    covered = {key: sum(n for _, n in spans) for key, spans in regions.items()}
    whole: dict[int, torch.Tensor] = {}
    rest: list[torch.Tensor] = []
    for t in tensors:
        storage = t.untyped_storage()
        if covered[storage.data_ptr()] == storage.nbytes():
            if storage.data_ptr() not in whole:
                whole[storage.data_ptr()] = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
        else:
            rest.append(t)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, min(os.cpu_count() or 1, TOUCH_THREADS)))
    try:
        for t in [*whole.values(), *rest]:
            t.zero_()
    finally:
        torch.set_num_threads(threads)


def _start(p2p: list[dist.P2POp], comm_device: torch.device) -> list[Any]:
    if not p2p:
        return []
    if comm_device.type == "cuda":  # NCCL needs its point-to-point calls grouped
        return dist.batch_isend_irecv(p2p)
    return [op.op(op.tensor, op.peer, tag=op.tag) for op in p2p]


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
    if offers is not None:  # rows into new memory last: its receiver touches it while the rest arrives
        pieces.sort(key=lambda p: offers[p.dst].fresh(p.path, full[p.path]))  # type: ignore[union-attr]
    incoming = [p for p in pieces if p.dst == rank and _bundled(p)]
    device_of = top[1].__getitem__ if top[1] is not None else lambda p: have[p][0].device.type
    filled = _targets(asks[rank], wants or {}, held, device_of, comm_device, incoming, prepared) if asks[rank] else {}
    # a tensor filled whole (its own, or new) is the whole block, cut along the source's dim
    into = {p: wanted[p] if p in wanted else (t, asks[rank][p]) for p, t in filled.items()}
    ready = {p for p, t in filled.items() if prepared is not None and prepared.holds(t)}  # touched already
    new = {p for p in filled if mine.fresh(p, full[p]) and p not in ready}
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
             prepared: Prepared | None = None) -> dict[str, torch.Tensor]:
    """Where this rank's rows go: its new shard, its own tensor of the same shape (received in place), or a
    new tensor on the device the source's was on (CUDA tensors on this rank's device)."""
    out: dict[str, torch.Tensor] = {}
    fresh: dict[str, tuple[Block, torch.device]] = {}
    for path, want in asks.items():
        if path in wants:
            out[path] = wants[path]
            continue
        own = held.get(path)
        if own is not None and not isinstance(own, DTensor) and tuple(own.shape) == want.shape \
                and own.dtype == want.dtype:
            out[path] = own
            continue
        fresh[path] = (want, comm_device if device_of(path) == "cuda" else torch.device("cpu"))
    return {**out, **_allocate(fresh, incoming, prepared)}


def _allocate(fresh: Mapping[str, tuple[Block, torch.device]], incoming: list[Piece], prepared: Prepared | None) \
        -> dict[str, torch.Tensor]:
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
    for (_, dtype, device), paths in runs.items():
        sizes = [math.prod(fresh[p][0].shape) for p in paths]
        flat = _empty((sum(sizes),), dtype, device, prepared)
        out.update({p: part.view(fresh[p][0].shape) for p, part in zip(paths, flat.split(sizes), strict=True)})
    for path, (want, device) in fresh.items():
        if path not in out:
            out[path] = _empty(want.shape, want.dtype, device, prepared)
    return out


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, prepared: Prepared | None) \
        -> torch.Tensor:
    """New memory: the prepared memory's next piece where it fits (touched already), else untouched."""
    made = prepared.empty(shape, dtype, device) if prepared is not None else None
    return made if made is not None else torch.empty(shape, dtype=dtype, device=device)


def _bundled(piece: Piece) -> bool:
    """Pieces under SMALL_BYTES between two ranks travel together per dtype, in messages of about BUNDLE_BYTES
    (every rank groups alike)."""
    return piece.src != piece.dst and piece.nbytes < SMALL_BYTES
