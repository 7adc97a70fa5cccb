"""ElasticSampler resumes mid-epoch under another world size exactly; GlobalBatch arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_shim.data import ElasticSampler, GlobalBatch

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`


def run_world(state: dict | None, length: int, world: int, rounds: int, per_rank: int,
              seen: list[int]) -> dict:
    """Simulate `world` ranks in lock-step for `rounds` rounds from a shared checkpointed state."""
    ranks = [ElasticSampler(length, r, world, seed=7) for r in range(world)]
    for s in ranks:
        if state is not None:
            s.load_state_dict(state)
    for _ in range(rounds):
        if ranks[0].exhausted:
            break
        for s in ranks:
            seen.extend(s.next_batch(per_rank))
    states = [s.state_dict() for s in ranks]
    assert all(st == states[0] for st in states), "ranks must agree on the global position"
    return states[0]


def test_resize_4_2_4_sees_every_sample_once() -> None:
    seen: list[int] = []
    state = run_world(None, 103, 4, 3, 5, seen)  # 60 consumed
    state = run_world(state, 103, 2, 4, 3, seen)  # +24 = 84
    state = run_world(state, 103, 4, 100, 5, seen)  # the tail, 19, is dealt unevenly
    assert sorted(seen) == list(range(103))
    assert state["consumed"] == 103


def test_iter_and_advance_match_next_batch() -> None:
    a = ElasticSampler(50, 1, 3, seed=1)
    a.advance(12)
    b = ElasticSampler(50, 1, 3, seed=1)
    b.load_state_dict(a.state_dict())
    assert list(a)[:4] == b.next_batch(4)
    assert len(a) == len(range(13, 50, 3))


def test_epochs_differ_and_reset() -> None:
    s = ElasticSampler(20, seed=3)
    first = list(s)
    s.advance(20)
    assert s.exhausted
    s.set_epoch(1)
    assert s.consumed == 0 and sorted(s) == sorted(first) and list(s) != first


def test_state_for_other_dataset_rejected() -> None:
    with pytest.raises(ValueError, match="dataset has 10"):
        ElasticSampler(10).load_state_dict(ElasticSampler(11).state_dict())


@settings(max_examples=60, deadline=None, database=None)  # no .hypothesis dir in the repo
@given(length=st.integers(1, 200), plan=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 6),
                                                            st.integers(1, 9)), min_size=1, max_size=6))
def test_any_resize_plan_is_exact(length: int, plan: list[tuple[int, int, int]]) -> None:
    seen: list[int] = []
    state = None
    for world, rounds, per_rank in plan:
        state = run_world(state, length, world, rounds, per_rank, seen)
    state = run_world(state, length, 1, length, 1, seen)  # finish the epoch on one rank
    assert sorted(seen) == list(range(length))


def test_global_batch() -> None:
    gb = GlobalBatch(64, 8, 4)
    assert gb.accum_steps == 2
    with pytest.raises(ValueError, match=r"not divisible by micro-batch 8 x world size 3 = 24"):
        GlobalBatch(64, 8, 3)
    with pytest.raises(ValueError, match="must all be >= 1"):
        GlobalBatch(64, 0, 2)
    assert GlobalBatch.fit(48, 3, 8) == GlobalBatch(48, 8, 3)
    assert GlobalBatch.fit(48, 4, 5).micro_batch == 4
    with pytest.raises(ValueError, match="cannot be split evenly over world size 5"):
        GlobalBatch.fit(48, 5, 8)
