"""A pre-started sharded worker's FSDP2 warm-up (trainer_shim/prestart.py): it leaves nothing behind."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from elasticd.wire.names import NEXT_WORLDS_ENV, REHEARSE_ENV
from trainer_shim.prestart import REHEARSAL_ENV, Rebuild, rehearse, rehearse_next, warm_sharding

pytestmark = pytest.mark.quick


def test_the_warm_up_leaves_no_process_group_and_draws_nothing_from_the_rng(caplog: pytest.LogCaptureFixture) -> None:
    """The worker joins its generation's group right after: none may be left initialized, and the script's
    seeded draws must be the ones it would have had without the warm-up (which did run: nothing was skipped)."""
    torch.manual_seed(7)
    expected = torch.rand(4)
    torch.manual_seed(7)
    with caplog.at_level("DEBUG", logger="trainer_shim"):
        warm_sharding()
    assert not dist.is_initialized() and "skipped" not in caplog.text
    assert torch.equal(torch.rand(4), expected)


def test_the_warm_up_stands_aside_when_the_process_already_holds_a_group() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = dist.group.WORLD
        warm_sharding()
        assert dist.is_initialized() and dist.group.WORLD is group and dist.get_world_size() == 1
    finally:
        dist.destroy_process_group()


def test_a_warm_up_that_fails_says_so_at_debug_and_the_worker_goes_on(monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("trainer_shim.prestart._step", lambda mesh: (_ for _ in ()).throw(RuntimeError("no FSDP")))
    with caplog.at_level("DEBUG", logger="trainer_shim"):
        warm_sharding()
    assert not dist.is_initialized() and "no FSDP" in caplog.text


def test_a_rehearsal_runs_the_scripts_rebuild_in_the_expected_world_and_leaves_nothing_behind() -> None:
    """The script's rebuild, state read and load once, as the last ranks of the world the daemon expects: on a
    mesh of that world (its collectives do nothing), with no group left and no RNG draw."""
    seen: list[tuple[int, int, tuple[int, ...]]] = []
    built: dict[str, torch.nn.Module] = {}

    def on_world(rank: int, size: int) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (size // 2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
        built["model"] = fully_shard(torch.nn.Linear(8, 8), mesh=mesh)
        torch.rand(1)  # the script draws: not from the process's stream
        seen.append((rank, size, tuple(mesh.shape)))

    loaded: list[dict] = []
    rebuild = Rebuild(on_world, lambda: built["model"].state_dict(), loaded.append)
    torch.manual_seed(7)
    expected = torch.rand(4)
    torch.manual_seed(7)
    assert rehearse(rebuild, {REHEARSE_ENV: "6", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == (6, 5)
    assert seen == [(5, 6, (3, 2))] and list(loaded[0]) == ["weight", "bias"]
    assert not dist.is_initialized() and torch.equal(torch.rand(4), expected)


def test_no_rehearsal_without_a_world_and_a_failed_one_says_so_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    def on_world(rank: int, size: int) -> None:
        raise RuntimeError("the script's own error")

    rebuild = Rebuild(on_world, dict, lambda state: None)
    assert rehearse(rebuild, {"LOCAL_WORLD_SIZE": "2"}) is None  # the daemon had no guess: nothing runs
    with caplog.at_level("DEBUG", logger="trainer_shim"):
        assert rehearse(rebuild, {REHEARSE_ENV: "4", "LOCAL_WORLD_SIZE": "2"}) is None
    assert "the script's own error" in caplog.text and not dist.is_initialized()


def test_a_jobs_first_workers_rehearse_the_worlds_one_change_away_at_the_ranks_they_would_have() -> None:
    """One node more keeps this rank; one fewer keeps it where it still fits, else a node below it left. The
    world it starts in is built anyway, and what is not a world size is left out."""
    seen: list[tuple[int, int]] = []
    rebuild = Rebuild(lambda rank, size: seen.append((rank, size)), dict, lambda state: None)
    env = {NEXT_WORLDS_ENV: "6,2,4,x,-2", "LOCAL_WORLD_SIZE": "2"}
    assert rehearse_next(rebuild, env, 4, 3) == [(2, 1), (6, 3)]  # the largest world last: the smallest shards stay
    assert rehearse_next(rebuild, env, 4, 0) == [(2, 0), (6, 0)]
    assert seen == [(1, 2), (3, 6), (0, 2), (0, 6)] and not dist.is_initialized()
    assert rehearse_next(rebuild, {"LOCAL_WORLD_SIZE": "2"}, 4, 0) == []
    assert rehearse_next(rebuild, {NEXT_WORLDS_ENV: "6", "LOCAL_WORLD_SIZE": "two"}, 4, 0) == []  # not a number


def test_the_user_can_turn_every_rehearsal_off(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int]] = []
    rebuild = Rebuild(lambda rank, size: seen.append((rank, size)), dict, lambda state: None)
    monkeypatch.setenv(REHEARSAL_ENV, "0")
    assert rehearse(rebuild, {REHEARSE_ENV: "4", "LOCAL_WORLD_SIZE": "2"}) is None
    assert rehearse_next(rebuild, {NEXT_WORLDS_ENV: "6", "LOCAL_WORLD_SIZE": "2"}, 4, 0) == [] and seen == []


def test_each_rehearsal_frees_the_one_before_it_which_the_script_no_longer_holds() -> None:
    """A rehearsal's model is the script's until its next `on_world`: the one it replaced is garbage held in
    reference cycles (FSDP2's), freed at once rather than beside the first world's real build."""
    import gc
    import weakref

    class Model:  # a cycle, as an FSDP2 module holds
        def __init__(self) -> None:
            self.me = self

    script: dict[str, Model] = {}
    built: list[weakref.ref[Model]] = []

    def on_world(rank: int, size: int) -> None:
        script["model"] = Model()
        built.append(weakref.ref(script["model"]))

    rebuild = Rebuild(on_world, dict, lambda state: None)
    gc.disable()  # no automatic pass: only the rehearsals' own collection may free it
    try:
        assert rehearse_next(rebuild, {NEXT_WORLDS_ENV: "2,6", "LOCAL_WORLD_SIZE": "2"}, 4, 0) == [(2, 0), (6, 0)]
        assert built[0]() is None and built[1]() is script["model"]
    finally:
        gc.enable()


def _sharded_script(built: dict[str, Any]) -> Rebuild:
    """A torchtitan-shaped rebuild on a 2-D mesh: FSDP2 per layer, AdamW, its state through DCP."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def on_world(rank: int, size: int) -> None:
        mesh = init_device_mesh("cpu", (size // 2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
        model = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.Linear(20, 6, bias=False))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        built["model"] = fully_shard(model, mesh=mesh)
        built["optim"] = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def read() -> dict[str, Any]:
        model, optim = get_state_dict(built["model"], built["optim"])
        return {"model": model, "optim": optim}

    def load(state: dict[str, Any]) -> None:
        set_state_dict(built["model"], built["optim"], model_state_dict=state["model"], optim_state_dict=state["optim"])

    return Rebuild(on_world, read, load)


def _clipping_worked_out(rebuild: Rebuild, built: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> int:
    """The real world after it (the same world and rank): a step's backward, then torchtitan's clipping; returns
    how many ops of the clipping DTensor had to work out the sharding of."""
    from torch.distributed.tensor import DTensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    propagator = DTensor._op_dispatcher.sharding_propagator
    worked_out: list[object] = []
    dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=4)
    try:
        rebuild.build(3, 4)
        rebuild.load(rebuild.read())
        model = built["model"]
        model(torch.ones(2, 12)).sum().backward()
        params = [p for p in model.parameters() if p.grad is not None]
        real = propagator.propagate_op_sharding_non_cached
        monkeypatch.setattr(propagator, "propagate_op_sharding_non_cached",
                            lambda schema: (worked_out.append(schema), real(schema))[1])
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
        torch.nn.utils.clip_grads_with_norm_(params, 1.0, norm.full_tensor(), foreach=True)
    finally:
        dist.destroy_process_group()
    return len(worked_out)


@pytest.mark.skipif(not hasattr(torch.nn.utils, "get_total_norm"), reason="torch < 2.6 has no get_total_norm")
def test_a_rehearsal_works_out_the_sharding_of_a_torchtitan_steps_gradient_clipping(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's clipping on a mesh never met costs DTensor's sharding of each foreach op over the whole gradient list
    (0.11 s for the titan variant): rehearsed, the real world's first clipping finds every one worked out. The
    rehearsal's own gradients are gone after it."""
    from trainer_shim.mesh_caches import forget

    built: dict[str, Any] = {}
    rebuild = _sharded_script(built)
    forget()
    assert _clipping_worked_out(rebuild, built, monkeypatch) > 0  # cold: the check can fail
    monkeypatch.undo()
    forget()
    assert rehearse(rebuild, {REHEARSE_ENV: "4", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == (4, 3)
    assert all(p.grad is None for p in built["model"].parameters())
    assert _clipping_worked_out(rebuild, built, monkeypatch) == 0
