"""The heal's plan (trainer_shim.heal_plan): who sends which rows to whom. Pure: no process group."""

from __future__ import annotations

import itertools

import pytest
import torch

from trainer_shim.heal_plan import NOTHING, SPLIT_BYTES, Block, Offer, Settled, Summary, block, plan, settle
from trainer_shim.state_paths import fill, flatten

pytestmark = pytest.mark.quick


def whole(rows: int, cols: int = 1024) -> Block:
    return Block((rows, cols), torch.float32, 0, 0, rows)


def shard(rows: int, lo: int, hi: int) -> Block:
    return Block((rows, 8), torch.float32, 0, lo, hi)


def test_a_rank_holding_the_freshest_state_receives_nothing_and_a_newcomer_receives_it_once() -> None:
    state = {"w": whole(4), "b": whole(1)}
    pieces, missing = plan({0: {}, 1: {}, 2: state}, {0: state, 1: state})
    assert not missing
    assert all(p.dst == 2 for p in pieces)
    assert sum(p.nbytes for p in pieces) == (4 + 1) * 1024 * 4  # the state once: not once per rank in the world


def test_a_large_block_is_split_over_holders_and_each_newcomer_has_its_own_sources() -> None:
    rows = SPLIT_BYTES // (1024 * 4) * 3  # three times the split threshold
    big = whole(rows)
    holds = {r: {"big": big} for r in range(4)}
    pieces, _ = plan({4: {"big": big}, 5: {"big": big}}, holds)
    assert sorted(p.src for p in pieces if p.dst == 4) == [0, 1]  # split over MAX_SOURCES (2) of the 4 holders
    assert sorted(p.src for p in pieces if p.dst == 5) == [2, 3]  # the next newcomer's from the two others
    for dst in (4, 5):
        mine = sorted((p.lo, p.hi) for p in pieces if p.dst == dst)
        assert mine[0][0] == 0 and mine[-1][1] == rows and sum(hi - lo for lo, hi in mine) == rows  # each row once
    small = {f"t{i}": whole(1) for i in range(4)}
    pieces, _ = plan({2: small}, {0: small, 1: small})
    assert sorted(p.src for p in pieces) == [0, 0, 1, 1]


def test_shards_come_from_the_replica_holding_the_same_rows_and_own_rows_are_copied_locally() -> None:
    # HSDP: ranks 0, 1 are one replica (rows 0-5, 5-10), ranks 2, 3 the newcomer replica wanting the same split.
    holds = {0: {"w": shard(10, 0, 5)}, 1: {"w": shard(10, 5, 10)}}
    wants = {0: {"w": shard(10, 0, 5)}, 1: {"w": shard(10, 5, 10)},
             2: {"w": shard(10, 0, 5)}, 3: {"w": shard(10, 5, 10)}}
    pieces, missing = plan(wants, holds)
    assert not missing
    moved = {(p.src, p.dst, p.lo, p.hi) for p in pieces}
    assert moved == {(0, 0, 0, 5), (1, 1, 5, 10), (0, 2, 0, 5), (1, 3, 5, 10)}
    assert all(p.nbytes == 0 for p in pieces if p.src == p.dst)  # a local copy moves nothing over the wire


def test_resharding_to_another_world_cuts_rows_across_old_owners() -> None:
    holds = {0: {"w": shard(9, 0, 3)}, 1: {"w": shard(9, 3, 6)}, 2: {"w": shard(9, 6, 9)}}
    wants = {0: {"w": shard(9, 0, 5)}, 1: {"w": shard(9, 5, 9)}}  # three ranks' shards onto two
    pieces, missing = plan(wants, holds)
    assert not missing
    assert {(p.src, p.dst, p.lo, p.hi) for p in pieces} == {(0, 0, 0, 3), (1, 0, 3, 5), (1, 1, 5, 6), (2, 1, 6, 9)}


def test_rows_no_live_rank_holds_are_named_and_a_first_world_takes_each_row_from_its_lowest_holder() -> None:
    holds = {0: {"w": shard(10, 0, 5)}}  # the rank holding rows 5-10 was lost, with no replica
    _, missing = plan({0: {"w": shard(10, 0, 10)}}, holds)
    assert missing == ["w"]
    state = {"w": whole(2)}
    pieces, _ = plan({0: state, 1: state, 2: state}, {0: state, 1: state, 2: state}, sole=True)
    assert {(p.src, p.dst) for p in pieces} == {(0, 0), (0, 1), (0, 2)}  # ranks 1 and 2 take rank 0's


def test_a_state_flattens_to_paths_and_fills_back() -> None:
    state = {"model": {"w": torch.ones(2)}, "opt": {"state": {0: {"step": torch.tensor(3.0)}}, "lr": [0.1]}, "n": 4}
    tensors: dict[str, torch.Tensor] = {}
    skeleton = flatten(state, tensors)
    assert sorted(tensors) == ["/'model'/'w'", "/'opt'/'state'/0/'step'"]
    again = fill(skeleton, {p: t * 2 for p, t in tensors.items()})
    assert again["opt"]["state"][0]["step"].item() == 6.0 and again["n"] == 4 and again["opt"]["lr"] == [0.1]


def test_after_a_crash_the_freshest_step_every_shard_has_is_restored_not_the_checkpoint() -> None:
    # HSDP, 2 shards: rank 0 finished step 11 (its shard 0), its peer died; the other replica (2, 3) is at 10.
    s0, s1 = shard(10, 0, 5), shard(10, 5, 10)
    offers = [Offer(11, True, {"w": s0}, {"w": s0}), None, Offer(10, True, {"w": s0}, {"w": s0}),
              Offer(10, True, {"w": s1}, {"w": s1})]
    settled = settle(offers)
    assert settled.step == 10 and not settled.missing and settled.source == 2
    assert {(p.src, p.dst) for p in settled.pieces} == {(2, 0), (2, 2), (3, 3)}  # rank 0 goes back to step 10
    lost = [Offer(11, True, {"w": s0}, {"w": s0}), Offer(NOTHING, True, {}, {"w": s1})]  # shard 1's only holder died
    assert settle(lost).missing == ["w"]


def test_an_empty_shard_is_neither_moved_nor_missing() -> None:
    """FSDP gives a rank no rows of a tensor smaller than the world (lo == hi): nothing to move, nothing lost."""
    pieces, missing = plan({0: {"b": shard(2, 2, 2)}, 1: {"b": shard(2, 0, 2)}}, {1: {"b": shard(2, 0, 2)}})
    assert missing == [] and [(p.dst, p.lo, p.hi) for p in pieces] == [(1, 0, 2)]
    pieces, missing = plan({0: {"b": shard(2, 2, 2)}}, {})  # nobody holds it, but rank 0 wants no rows of it
    assert (pieces, missing) == ([], [])


def test_equal_blocks_are_one_object_so_an_offer_of_many_tensors_pickles_small() -> None:
    """Every rank unpickles every rank's offer: a model's thousands of same-shaped tensors must not cost a block each
    (issue 35: unpickling the offers was a third of a 5,000-tensor heal)."""
    import pickle

    from trainer_shim.heal import block_of

    tensors = {f"layers.{i}.w": torch.zeros(4, 8) for i in range(1000)}
    blocks = [block_of(t)[1] for t in tensors.values()]
    assert all(b is blocks[0] for b in blocks) and blocks[0].row_bytes == 32
    offer = Offer(3, True, dict(zip(tensors, blocks, strict=True)), None)
    assert len(pickle.dumps(offer)) < 25 * len(tensors)  # its paths and one block, not a block per tensor


def test_the_offers_are_skipped_only_where_every_rank_heals_from_its_own_rows() -> None:
    """Summary.self_sufficient: a drain's survivors heal alone; a newcomer, a rank behind, a reshard, or ranks
    whose tensors differ need every offer."""
    ddp = {"w": whole(4), "b": whole(1)}
    kept = [Offer(10, True, ddp, None) for _ in range(3)]
    assert Summary.self_sufficient([o.summary() for o in kept])
    assert not Summary.self_sufficient([o.summary() for o in [*kept, Offer(NOTHING, True, {}, None)]])
    assert not Summary.self_sufficient([o.summary() for o in [*kept[:2], Offer(9, True, ddp, None)]])
    assert not Summary.self_sufficient([o.summary() for o in [*kept[:2], Offer(10, False, ddp, None)]])
    assert not Summary.self_sufficient([o.summary() for o in [*kept[:2], Offer(10, True, {"w": whole(4)}, None)]])
    # HSDP where only the replicas changed: each rank wants the rows it holds, copied into its new shard.
    same = [Offer(10, True, {"w": shard(10, lo, hi)}, {"w": shard(10, lo, hi)}) for lo, hi in ((0, 5), (5, 10))]
    assert Summary.self_sufficient([o.summary() for o in same])
    settled = Settled.alone(same[1], 1)
    assert [(p.src, p.dst, p.lo, p.hi) for p in settled.pieces] == [(1, 1, 5, 10)] and not settled.missing
    resharded = [Offer(10, True, {"w": shard(10, lo, hi)}, {"w": shard(10, a, b)})
                 for (lo, hi), (a, b) in (((0, 5), (0, 4)), ((5, 10), (4, 10)))]
    assert not Summary.self_sufficient([o.summary() for o in resharded])


def _reference_plan(wants: dict[int, dict[str, Block]], holds: dict[int, dict[str, Block]],
                    sole: bool) -> list[tuple[str, int, int, int, int]]:
    """The plan's rule written plainly, per rank and per path: every row range from the least loaded holders."""
    load = {r: 0 for r in holds}
    out = []
    for dst in sorted(wants):
        for path, want in wants[dst].items():
            holders = [(r, h[path]) for r, h in sorted(holds.items()) if path in h]
            points = sorted({want.lo, want.hi, *(b for _, h in holders for b in (h.lo, h.hi) if want.lo < b < want.hi)})
            for lo, hi in itertools.pairwise(points):
                ranks = [r for r, h in holders if h.lo <= lo and hi <= h.hi][:1 if sole else None]
                if not ranks or dst in ranks:
                    out.extend([(path, dst, dst, lo, hi)] if ranks else [])
                    continue
                nbytes = (hi - lo) * want.row_bytes
                parts = min(len(ranks), 2, hi - lo) if nbytes >= SPLIT_BYTES else 1
                for i, src in enumerate(sorted(ranks, key=lambda r: (load[r], r))[:parts]):
                    a, b = lo + (hi - lo) * i // parts, lo + (hi - lo) * (i + 1) // parts
                    out.append((path, src, dst, a, b))
                    load[src] += (b - a) * want.row_bytes
    return out


@pytest.mark.parametrize("seed", range(6))
def test_ranks_with_one_offer_object_plan_as_the_rule_says_for_each_rank(seed: int) -> None:
    """Alike offers are unpickled once and shared by their ranks, which the plan looks up as one group and picks
    among with a heap: the pieces must be exactly those of the rule applied rank by rank and path by path, whatever
    mix of shared and own offers, shard layouts, sizes and ties. Blocks are interned, as a heal's are: paths of
    one shape share their holders, and a rank's load grows in one path's picks and counts in another's. Planned
    as one rank (`me`), the moves are the same, in the same order (their tags), with only that rank's own copies:
    a holder that has every row it wants is not walked."""
    import random

    rng = random.Random(seed)
    paths = [f"p{i}" for i in range(40)]
    rows = {p: rng.choice([8, 64, 1 << 15]) for p in paths}  # 1 << 15 rows of 1 KB: large enough to split

    def layout(parts: int, i: int) -> dict[str, Block]:
        out = {}
        for p in paths:
            n = rows[p]
            out[p] = block((n, 256), torch.float32, 0, n * i // parts, n * (i + 1) // parts)
        return out

    shared = {p: block((rows[p], 256), torch.float32, 0, 0, rows[p]) for p in paths}  # whole: data parallel
    halves = [layout(2, 0), layout(2, 1)]
    holds: dict[int, dict[str, Block]] = {}
    for rank in range(rng.randint(6, 14)):
        kind = rng.random()
        holds[rank] = shared if kind < 0.5 else halves[rank % 2] if kind < 0.8 else dict(shared)
    newcomers = range(len(holds), len(holds) + rng.randint(1, 3))
    wants = {r: {p: block((rows[p], 256), torch.float32, 0, 0, rows[p]) for p in paths} for r in newcomers}
    wants[0] = layout(3, 1)  # a holder resharded: some rows its own, the rest from others
    for rank, held in holds.items():  # HSDP survivors want the rows they hold (the same object, as alike offers)
        if rank and held is not shared and rng.random() < 0.7:
            wants[rank] = held
    for sole in (False, True):
        reference = _reference_plan(wants, holds, sole)
        pieces, missing = plan(wants, holds, sole)
        assert [(p.path, p.src, p.dst, p.lo, p.hi) for p in pieces] == reference and missing == []
        for me in [0, *wants]:  # as each rank plans it: the same moves, in order, and only its own copies
            mine, missing = plan(wants, holds, sole, me)
            assert [(p.path, p.src, p.dst, p.lo, p.hi) for p in mine] == \
                [p for p in reference if p[1] != p[2] or p[2] == me] and missing == []
