"""A pre-started sharded worker's FSDP2 warm-up (trainer_shim/prestart.py): it leaves nothing behind."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from trainer_shim.prestart import warm_sharding

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
