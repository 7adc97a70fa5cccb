"""A pre-started newcomer's heal fills memory it touched before its round, and ends as equal as without it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support.harness import free_port
from support.spawned import gloo_world, spawned

from elasticd.wire.names import JOB_STORE_ENV
from trainer_shim.heal import heal
from trainer_shim.heal_moves import touch
from trainer_shim.prepared import MIN_BYTES, Prepared, lacking, prepare, publish, sizes

MOMENT = 1 << 19  # floats: 2 MB a moment


def state(survivor: bool) -> dict[str, torch.Tensor]:
    """A model's two weights; a survivor also holds an optimizer's two moments of each (a newcomer: none yet)."""
    g = torch.Generator().manual_seed(7 if survivor else 1)
    out = {f"w{i}": torch.randn(MOMENT, generator=g) for i in range(2)}
    if survivor:
        out |= {f"m{i}/{k}": torch.randn(MOMENT, generator=g) for i in range(2) for k in ("exp_avg", "exp_avg_sq")}
        out["step"] = torch.tensor(10.0)
    return out


def member(rank: int, port: int, spare_bytes: int, out: dict[int, Any]) -> None:
    gloo_world(rank, port, 2, 30)
    held = state(survivor=rank == 0)
    prepared = None
    if rank == 1:  # the newcomer, pre-started: it read the survivors' size and touched that much
        need = lacking(sizes(state(survivor=True)), sizes(held))
        prepared = Prepared({"cpu": torch.zeros(spare_bytes or need["cpu"], dtype=torch.uint8)})
    healed, filled = heal(10 if rank == 0 else 0, held, None, None, torch.device("cpu"), True, prepared)
    mine = {**held, **filled}
    storages = [] if prepared is None else [b.untyped_storage().data_ptr() for b in prepared.buffers.values()]
    out[rank] = {"digest": {p: float(t.double().sum()) for p, t in sorted(mine.items())},
                 "prepared_bytes": healed.prepared_bytes, "received": healed.received_bytes,
                 "in_prepared": sorted(p for p, t in filled.items() if t.untyped_storage().data_ptr() in storages)}
    dist.destroy_process_group()


@pytest.mark.parametrize("spare", ["fits", "too small"])
def test_a_newcomers_new_tensors_take_its_prepared_memory_and_end_equal(spare: str) -> None:
    """Every moment the newcomer lacked lands in its prepared memory where it fits, the rest in new memory; the
    two ranks end with equal state either way, and the heal says how much went into the prepared memory."""
    moment_bytes = MOMENT * 4
    result = spawned(member, 2, free_port(), moment_bytes + 128 if spare == "too small" else 0)
    assert result[0]["digest"] == result[1]["digest"]
    assert result[0]["prepared_bytes"] == 0  # the survivor received nothing
    if spare == "fits":
        assert len(result[1]["in_prepared"]) == 5  # four moments and the step
        assert result[1]["prepared_bytes"] == 4 * moment_bytes + 4
    else:
        assert len(result[1]["in_prepared"]) == 2  # the step and one moment: the rest in new memory
        assert result[1]["prepared_bytes"] == moment_bytes + 4
    assert result[1]["received"] >= 4 * moment_bytes


def test_what_a_newcomer_lacks_is_the_published_state_less_its_own_per_device_and_dtype() -> None:
    published = {"cpu": {"float32": [100 << 20, 30], "int64": [8, 1]}, "cuda": {"bfloat16": [10, 2]}}
    held = {"cpu": {"float32": [40 << 20, 10]}}
    need = lacking(published, held)
    assert need == {"cpu": (60 << 20) + 8 + 64 * 21}  # the tensors it lacks each start aligned; cuda's is tiny
    assert lacking(published, {"cpu": {"float32": [100 << 20, 30]}}) == {}  # all but 8 bytes held: nothing
    assert MIN_BYTES > 10 + 64 * 2


def test_a_pre_started_rank_reads_the_size_from_the_jobs_store_and_touches_what_it_lacks() -> None:
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=10))
    env = {JOB_STORE_ENV: f"127.0.0.1:{port}/elastic/job"}
    touched: list[torch.Tensor] = []

    def touching(tensors: list[torch.Tensor]) -> None:
        touched.extend(tensors)
        touch(tensors)

    assert prepare(env, lambda: state(False), torch.device("cpu"), touching) is None  # nothing published yet
    publish(server, "elastic/job", lambda: state(True))
    prepared = prepare(env, lambda: state(False), torch.device("cpu"), touching)
    assert prepared is not None and touched and prepared.nbytes == 4 * MOMENT * 4 + 4 + 64 * 5
    assert prepare({JOB_STORE_ENV: "nowhere"}, lambda: state(False), torch.device("cpu"), touch) is None
    assert prepare({}, lambda: state(False), torch.device("cpu"), touch) is None

    def not_yet() -> dict[str, torch.Tensor]:
        raise AttributeError("'World' object has no attribute 'model'")  # a script that builds in on_world

    assert prepare(env, not_yet, torch.device("cpu"), touch) is None
    for junk in ("{half", '{"cpu": {"float32": "x"}}', '{"cpu": {"float32": [1e30, 1]}}'):  # torn, odd, absurd
        server.set("elastic/job/state_size", junk)
        assert prepare(env, lambda: state(False), torch.device("cpu"), touch) is None, junk
