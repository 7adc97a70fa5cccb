"""Atomic checksummed saves, keep-last-K, corrupt-file skipping, background saves, DCP round trip."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from trainer_shim.checkpoint import (
    Checkpointer,
    CorruptCheckpoint,
    list_checkpoints,
    load_file,
    load_latest,
    save_file,
)
from trainer_shim.sharded import list_sharded, load_sharded, save_sharded


class Recorder:
    """Stands in for a session: records what would be reported."""

    def __init__(self) -> None:
        self.saved: list[tuple] = []
        self.skipped: list[tuple[str, str]] = []

    def report_checkpoint(self, step, path, nbytes, duration_s, request_id=None) -> None:
        self.saved.append((step, path, nbytes, duration_s, request_id))

    def report_skipped(self, path: str, reason: str) -> None:
        self.skipped.append((path, reason))


def state(step: int) -> dict:
    return {"w": torch.full((4, 4), float(step)), "step": step}


def test_atomic_save_keeps_last_k(tmp_path) -> None:
    rec = Recorder()
    ck = Checkpointer(str(tmp_path), keep=2, session=rec)
    for step in (10, 20, 30):
        res = ck.save(state(step), step, request_id=f"r{step}")
        assert res is not None and res.nbytes == os.path.getsize(res.path)
    assert [s for s, _ in list_checkpoints(str(tmp_path))] == [20, 30]
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000020.pt", "ckpt-00000030.pt"]  # no temp files
    assert [(s, r) for s, _, _, _, r in rec.saved] == [(10, "r10"), (20, "r20"), (30, "r30")]
    loaded = load_latest(str(tmp_path))
    assert loaded is not None and loaded.step == 30 and loaded.state["step"] == 30


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_corrupt_newest_is_skipped(tmp_path, damage: str) -> None:
    ck = Checkpointer(str(tmp_path), keep=5)
    ck.save(state(1), 1)
    newest = ck.save(state(2), 2).path
    data = Path(newest).read_bytes()
    bad = {"truncate": data[: len(data) // 2], "flip": data[:-10] + bytes([data[-10] ^ 1]) + data[-9:],
           "empty": b"", "garbage": b"x" * 100}[damage]
    Path(newest).write_bytes(bad)
    rec = Recorder()
    loaded = load_latest(str(tmp_path), session=rec)
    assert loaded is not None and loaded.step == 1 and torch.equal(loaded.state["w"], state(1)["w"])
    assert len(rec.skipped) == 1 and rec.skipped[0][0] == newest


def test_checksum_mismatch_detected(tmp_path) -> None:
    path = str(tmp_path / "x.pt")
    save_file(state(3), path)
    data = bytearray(Path(path).read_bytes())
    data[50] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match="sha256 mismatch"):
        load_file(path)


def test_no_valid_checkpoint(tmp_path) -> None:
    assert load_latest(str(tmp_path / "missing")) is None
    (tmp_path / "ckpt-00000005.pt").write_bytes(b"torn")
    rec = Recorder()
    assert load_latest(str(tmp_path), session=rec) is None and len(rec.skipped) == 1


def test_resumed_older_save_is_never_pruned(tmp_path) -> None:
    ck = Checkpointer(str(tmp_path), keep=1)
    (tmp_path / "ckpt-00000090.pt").write_bytes(b"torn")  # a later, corrupt leftover
    res = ck.save(state(40), 40)
    assert os.path.exists(res.path)
    assert load_latest(str(tmp_path)).step == 40


def test_background_save_snapshots_and_reports(tmp_path) -> None:
    rec = Recorder()
    ck = Checkpointer(str(tmp_path), keep=3, session=rec, background=True)
    live = state(7)
    assert ck.save(live, 7, request_id="bg") is None
    live["w"].add_(100.0)  # training goes on mutating; the snapshot must not see it
    res = ck.wait()
    assert res is not None and res.step == 7 and rec.saved[0][4] == "bg"
    assert torch.equal(load_latest(str(tmp_path)).state["w"], state(7)["w"])
    ck.save(state(8), 8)
    ck.save(state(9), 9)  # waits for the one in flight first
    assert ck.wait().step == 9 and [s for s, *_ in rec.saved] == [7, 8, 9]


def test_background_error_surfaces_on_wait(tmp_path) -> None:
    ck = Checkpointer(str(tmp_path), background=True)
    ck.save({"bad": lambda: 0}, 1)  # not picklable
    with pytest.raises(Exception):  # noqa: B017 - pickling raises one of several types
        ck.wait()
    assert list_checkpoints(str(tmp_path)) == [] and not [n for n in os.listdir(tmp_path) if "tmp" in n]


def _two_rank_worker(rank: int, root: str) -> None:
    store = dist.FileStore(os.path.join(root, "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        torch.manual_seed(0)  # plain tensors are replicated: dcp dedups them to one writer
        model = torch.nn.Linear(4, 3)
        save_sharded({"model": model.state_dict()}, os.path.join(root, "ck"), 3)
        fresh = torch.nn.Linear(4, 3)
        target = {"model": fresh.state_dict()}
        assert load_sharded(target, os.path.join(root, "ck")) == 3
        assert torch.equal(target["model"]["weight"], model.weight.detach())
    finally:
        dist.destroy_process_group()


def test_dcp_two_ranks_gloo(tmp_path) -> None:
    pytest.importorskip("numpy", reason="torch's object collectives (used by dcp planning) need numpy")
    # fork: the children start in milliseconds instead of importing torch again (seconds on 2 cores).
    ctx = torch.multiprocessing.start_processes(_two_rank_worker, args=(str(tmp_path),), nprocs=2, join=False,
                                                start_method="fork")
    deadline = time.monotonic() + 60
    try:
        while not ctx.join(timeout=1):  # raises if a rank failed; a hang fails here, not at pytest's limit
            assert time.monotonic() < deadline, "2-rank dcp save/load did not finish in 60 s"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()


def test_dcp_sharded_round_trip(tmp_path) -> None:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = torch.nn.Linear(4, 3)
        rec = Recorder()
        for step in (5, 6, 7):
            save_sharded({"model": model.state_dict()}, str(tmp_path / "ck"), step, keep=2, session=rec)
        assert [s for s, _ in list_sharded(str(tmp_path / "ck"))] == [6, 7] and rec.saved[-1][0] == 7
        os.makedirs(tmp_path / "ck" / "sharded-00000009.tmp")  # a torn attempt is never picked
        os.makedirs(tmp_path / "ck" / "sharded-00000008")  # nor one without .metadata
        fresh = torch.nn.Linear(4, 3)
        target = {"model": fresh.state_dict()}
        assert load_sharded(target, str(tmp_path / "ck")) == 7
        fresh.load_state_dict(target["model"])
        assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)
    finally:
        dist.destroy_process_group()
