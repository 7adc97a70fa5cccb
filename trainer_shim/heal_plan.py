"""A heal's plan: who sends which rows to whom, from every rank's offer; pure, so the same on every rank.

docs/architecture.md, "Healing". No process group here: trainer_shim.heal gathers the offers and moves the rows.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import chain, pairwise
from typing import Any

import torch

SPLIT_BYTES = 4 << 20  # a missing block at least this large is split over the ranks holding it
MAX_SOURCES = 2  # over at most this many: more senders into one receiver only contend for its copy-out
NOTHING = -1  # the step of a rank that holds nothing (a newcomer whose job has a checkpoint to fall back to)


@dataclass(frozen=True)
class Block:
    """Rows [lo, hi) along `dim` of a tensor of global `shape`: all of a plain tensor, one shard of a DTensor.
    Made through `block()`, so equal blocks are one object: a model's many tensors of one shape pickle as one."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    dim: int
    lo: int
    hi: int

    @cached_property
    def row_bytes(self) -> int:
        per = 1
        for i, n in enumerate(self.shape):
            if i != self.dim:
                per *= n
        return per * self.dtype.itemsize

    def full(self) -> Block:
        return block(self.shape, self.dtype, self.dim, 0, self.shape[self.dim] if self.shape else 1)


@lru_cache(maxsize=1 << 16)
def block(shape: tuple[int, ...], dtype: torch.dtype, dim: int, lo: int, hi: int) -> Block:
    """The one Block of these fields. A heal's offers list a block per tensor and every rank unpickles every offer:
    shared, the thousands of same-shaped tensors of a model cost one block each way, not one each (issue 35)."""
    return Block(shape, dtype, dim, lo, hi)


@dataclass
class Piece:
    """Rows [lo, hi) of the tensor at `path` go from `src` to `dst` (a local copy when they are the same rank)."""

    path: str
    src: int
    dst: int
    lo: int
    hi: int
    nbytes: int
    dtype: torch.dtype = torch.float32


@dataclass
class Offer:
    """What one rank brings to a heal (gathered from every rank)."""

    step: int  # the step of what it holds; NOTHING for none
    vouched: bool  # it held this state in a world with the others (a new process's own state may differ)
    holds: dict[str, Block]  # the blocks it holds (at `step`)
    wants: dict[str, Block] | None  # None: whatever of the source's tensors it lacks, whole (data parallel)

    @cached_property
    def own_asks(self) -> tuple[dict[str, Block], dict[str, Block]]:
        """Each tensor's whole block by path, and what it asks for, where it is its own source (a holder): the
        summary and a self-sufficient plan both use them."""
        full = {p: b.full() for p, b in self.holds.items()}
        return full, _asks(self, full, holder=True)

    def __getstate__(self) -> dict[str, Any]:
        """What other ranks unpickle: the fields, not what this rank derived from them."""
        return {k: v for k, v in self.__dict__.items() if k != "own_asks"}

    def summary(self) -> Summary:
        """Its step, whether it is vouched for and holds every row it asks for, and its layout's digest."""
        full, asks = self.own_asks
        covers = _covers(asks, self.holds) and (
            self.wants is not None or all(b is full[p] or b == full[p] for p, b in self.holds.items()))
        texts: dict[int, str] = {}  # per block: a model's same-shaped tensors share one (interned)
        for b in full.values():
            if id(b) not in texts:
                texts[id(b)] = f"|{b.shape}|{b.dtype}|{b.dim}"
        text = ";".join(p + texts[id(b)] for p, b in sorted(full.items()))
        return Summary(self.step, self.vouched, covers, digest64(text.encode()))

    def fresh(self, path: str, full: Block) -> bool:
        """Whether this rank has no tensor of its own for that path yet: its rows go into new memory."""
        if self.wants is not None:
            return path not in self.wants
        return self.holds.get(path) != full


Cut = tuple[int, int, tuple[int, ...], frozenset[int]]  # rows [lo, hi), the ranks holding all of them (ascending)


class _Cuts:
    """Consecutive row ranges of what a rank wants of a path, each with the ranks holding all of it (the lowest
    only, `sole`), computed once per layout: a model's same-shaped tensors share their blocks (interned, and once
    per offer when unpickled), so their wants and holders are the same objects. Cutting each path anew took an
    HSDP plan 20 ms at 1,332 tensors (issue 35). Ranks whose offers are one object (alike offers are unpickled
    once: a data-parallel world's survivors, trainer_shim.heal) are one group, looked up once per path, so a plan
    costs the distinct offers times the tensors, not the world times the tensors."""

    def __init__(self, holds: Mapping[int, Mapping[str, Block]], sole: bool) -> None:
        groups: dict[int, tuple[Mapping[str, Block], list[int]]] = {}
        for rank, held in sorted(holds.items()):
            groups.setdefault(id(held), (held, []))[1].append(rank)
        self.groups, self.sole = list(groups.values()), sole
        self.layout: dict[str, tuple[int, ...]] = {}  # a path's holders' blocks, by their identities
        self.holders: dict[tuple[int, ...], list[tuple[list[int], Block]]] = {}  # those blocks with their ranks
        self.cut: dict[tuple[int, tuple[int, ...]], list[Cut]] = {}

    def __call__(self, path: str, want: Block) -> list[Cut]:
        layout = self.layout.get(path)
        if layout is None:  # the same for every rank that wants the path; every block outlives the plan
            blocks = [held.get(path) for held, _ in self.groups]
            layout = self.layout[path] = tuple(map(id, blocks))
            if layout not in self.holders:
                self.holders[layout] = [(ranks, b) for (_, ranks), b in zip(self.groups, blocks, strict=True)
                                        if b is not None]
        key = (id(want), layout)
        ranges = self.cut.get(key)
        if ranges is None:
            counted = [(lo, hi, ranks[:1] if self.sole else ranks)
                       for lo, hi, ranks in _cuts(want, self.holders[layout])]
            ranges = self.cut[key] = [(lo, hi, ranks, frozenset(ranks)) for lo, hi, ranks in counted]
        return ranges


def _cuts(want: Block, holders: list[tuple[list[int], Block]]) -> list[tuple[int, int, tuple[int, ...]]]:
    """Consecutive row ranges of `want`, each with the ranks holding all of it, ascending."""
    if want.lo < want.hi and all(h.lo <= want.lo and want.hi <= h.hi for _, h in holders):  # every holder has all
        # (an empty shard, lo == hi, has no range at all: the general path below yields none)
        return [(want.lo, want.hi, _ascending(r for r, _ in holders))]
    points = sorted({want.lo, want.hi, *(b for _, h in holders for b in (h.lo, h.hi) if want.lo < b < want.hi)})
    return [(lo, hi, _ascending(r for r, h in holders if h.lo <= lo and hi <= h.hi)) for lo, hi in pairwise(points)]


def _ascending(groups: Iterable[list[int]]) -> tuple[int, ...]:
    return tuple(sorted(chain.from_iterable(groups)))


class _Least:
    """Among some holders, those with the fewest bytes to send so far, the lowest rank first among equals: a heap
    per distinct tuple of holders, kept lazily (a rank's load only grows, so an entry below its load is stale and
    goes back in with it). Picking by a scan of every holder cost a 256-rank data-parallel plan 0.3 M key calls."""

    def __init__(self, load: dict[int, int]) -> None:
        self.load = load
        self.heaps: dict[int, list[tuple[int, int]]] = {}  # by the identity of a tuple of ranks (the cuts keep it)

    def take(self, ranks: tuple[int, ...], count: int) -> list[int]:
        """The `count` least loaded of `ranks`, in that order; `give` them back once their loads grew."""
        heap = self.heaps.get(id(ranks))
        if heap is None:
            heap = self.heaps[id(ranks)] = [(self.load[r], r) for r in ranks]
            heapq.heapify(heap)
        chosen: list[int] = []
        while len(chosen) < count:
            seen, rank = heap[0]
            if seen != self.load[rank]:
                heapq.heapreplace(heap, (self.load[rank], rank))
                continue
            chosen.append(heapq.heappop(heap)[1])
        return chosen

    def give(self, ranks: tuple[int, ...], chosen: list[int]) -> None:
        for rank in chosen:
            heapq.heappush(self.heaps[id(ranks)], (self.load[rank], rank))


def plan(wants: Mapping[int, Mapping[str, Block]], holds: Mapping[int, Mapping[str, Block]], sole: bool = False,
         me: int | None = None) -> tuple[list[Piece], list[str]]:
    """Who sends which rows to whom, and the paths with rows nobody holds. A rank's own rows are a local copy;
    the rest go to the holder with the fewest bytes to send so far, a large range split over all of them.
    `sole`: only the lowest rank holding some rows counts (holders never trained together may differ). `me`: the
    rank planning, whose own copies are the only ones listed: another rank's concern only that rank, and a holder
    that has every row it wants (an HSDP survivor) is not walked at all, so the plan costs the ranks that receive,
    not the world (every rank of a heal lists the same moves, in the same order)."""
    load: dict[int, int] = {r: 0 for r in holds}
    least = _Least(load)
    pieces: list[Piece] = []
    missing: list[str] = []
    cuts = _Cuts(holds, sole)
    covered: dict[tuple[int, int], bool] = {}  # by the identities of a rank's wants and holds (alike ranks share)
    for dst in sorted(wants):
        if me is not None and dst != me and not sole and dst in holds:
            key = (id(wants[dst]), id(holds[dst]))
            if key not in covered:
                covered[key] = _covers(wants[dst], holds[dst])
            if covered[key]:
                continue
        for path, want in wants[dst].items():
            for lo, hi, ranks, members in cuts(path, want):
                if not ranks:
                    missing.append(path)
                    continue
                if dst in members:
                    if me is None or dst == me:
                        pieces.append(Piece(path, dst, dst, lo, hi, 0, want.dtype))
                    continue
                nbytes = (hi - lo) * want.row_bytes
                if len(ranks) == 1:  # its only holder (a shard with no other copy): no choice to make
                    pieces.append(Piece(path, ranks[0], dst, lo, hi, nbytes, want.dtype))
                    load[ranks[0]] += nbytes
                    continue
                parts = min(len(ranks), MAX_SOURCES, hi - lo) if nbytes >= SPLIT_BYTES else 1
                chosen = least.take(ranks, parts)
                for i, src in enumerate(chosen):
                    a, b = lo + (hi - lo) * i // parts, lo + (hi - lo) * (i + 1) // parts
                    pieces.append(Piece(path, src, dst, a, b, (b - a) * want.row_bytes, want.dtype))
                    load[src] += (b - a) * want.row_bytes
                least.give(ranks, chosen)
    return pieces, sorted(set(missing))


@dataclass
class Settled:
    """The step a heal restores, the lowest rank holding it (whose structure every rank takes), and the plan."""

    step: int
    source: int
    full: dict[str, Block]  # each tensor's whole block, by path
    asks: dict[int, dict[str, Block]]
    pieces: list[Piece]
    missing: list[str]

    @classmethod
    def alone(cls, offer: Offer, rank: int) -> Settled:
        """The plan where every rank is self-sufficient (its summary `covers`): its own rows, copied where its new
        tensors want them, each want whole from its own block (what `plan` makes of one rank, without its cuts)."""
        full, asks = offer.own_asks
        pieces = [Piece(path, rank, rank, want.lo, want.hi, 0, want.dtype) for path, want in asks.items()
                  if want.lo < want.hi]
        return cls(offer.step, 0, full, {rank: asks}, pieces, [])


def settle(offers: list[Offer | None], me: int | None = None) -> Settled:
    """The freshest step whose whole state the live ranks hold, and its plan. After a crash in a sharded job one
    rank may have finished a step its peers had not (its shard at S+1, the rest only at S): step S, which
    every shard has, is restored rather than the checkpoint. With no complete step: the freshest, with what is
    missing ("*": no rank holds anything). `me`: the rank settling, as `plan` takes it."""
    steps = sorted({o.step for o in offers if o is not None and o.step != NOTHING}, reverse=True)
    first: Settled | None = None
    for step in steps:
        at = {r: o for r, o in enumerate(offers) if o is not None and o.step == step}
        sole = not any(o.vouched for o in at.values())
        holders = {r: o.holds for r, o in at.items() if o.vouched or sole}
        source = min(at)
        full = {p: b.full() for p, b in at[source].holds.items()}
        asked: dict[tuple[int, bool], dict[str, Block]] = {}  # alike offers (one object) ask alike: once
        asks = {}
        for rank, offer in enumerate(offers):
            if offer is not None:
                key = (id(offer), rank in holders and not sole)
                if key not in asked:
                    asked[key] = _asks(offer, full, key[1])
                asks[rank] = asked[key]
        pieces, missing = plan(asks, holders, sole, me)
        found = Settled(step, source, full, asks, pieces, missing)
        if not missing:
            return found
        first = first or found
    return first or Settled(NOTHING, 0, {}, {}, [], ["*"])


def _asks(offer: Offer, full: dict[str, Block], holder: bool) -> dict[str, Block]:
    if offer.wants is not None:
        return {p: offer.wants.get(p, b) for p, b in full.items()}
    return {} if holder else full


def digest64(data: bytes) -> int:
    """A digest that fits an int64 tensor's element (the offers' first all-gather carries them)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


@dataclass(frozen=True)
class Summary:
    """One rank's offer in four numbers, exchanged before the offers themselves: where every rank is vouched for
    at one step, holds the same tensors and already has every row it wants, the offers are never sent."""

    step: int
    vouched: bool
    covers: bool  # it holds every row it asks for (at `step`)
    layout: int  # a digest of its tensors' paths and whole blocks

    def row(self) -> list[int]:
        return [self.step, int(self.vouched), int(self.covers), self.layout]

    @staticmethod
    def self_sufficient(rows: list[Summary]) -> bool:
        """Whether every rank can heal from its own rows: all vouched for at one step, one layout, covered."""
        first = rows[0]
        return first.step != NOTHING and all(
            r.vouched and r.covers and (r.step, r.layout) == (first.step, first.layout) for r in rows)


def _covers(wants: Mapping[str, Block], holds: Mapping[str, Block]) -> bool:
    """Whether `holds` has every row of every block in `wants`."""
    return all(p in holds and _within(want, holds[p]) for p, want in wants.items())


def _within(want: Block, held: Block) -> bool:
    return want.lo == want.hi or (want.dim == held.dim and held.lo <= want.lo and want.hi <= held.hi)
