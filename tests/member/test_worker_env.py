"""A worker's environment beyond torchrun's contract: what the job's first sharded workers rehearse at start."""

from __future__ import annotations

import pytest

from elasticd.job.config import JobConfig
from elasticd.member.processes.workers import WorkerGroup
from elasticd.wire.assignment import RoundAssignment
from elasticd.wire.names import NEXT_WORLDS_ENV

pytestmark = pytest.mark.quick


def env(nnodes: tuple[int, int], world: int, **round_fields: object) -> dict[str, str]:
    cfg = JobConfig(nnodes[0], nnodes[1], 2, "127.0.0.1", 29400, "job", "a", ["train.py"])
    fields = {"store": "127.0.0.1:1", "prefix": "elastic/job/g1", **round_fields}
    assignment = RoundAssignment(1, ranks=[0, 1], world_size=world, group_rank=0, group_world_size=world // 2,
                                 **fields)  # type: ignore[arg-type]
    return WorkerGroup(cfg, 1, assignment, {}, lambda worker: None, None).env_for(0, 0)  # type: ignore[arg-type]


def test_the_jobs_start_names_the_worlds_one_node_away_within_nnodes() -> None:
    assert env((1, 3), 4)[NEXT_WORLDS_ENV] == "6,2"
    assert env((1, 2), 2)[NEXT_WORLDS_ENV] == "4"  # one node, at most two: only a join
    assert env((2, 2), 4).get(NEXT_WORLDS_ENV) is None  # a fixed size: no change to rehearse


def test_no_rehearsal_inside_a_stall_after_a_restart_or_without_in_place_resizes() -> None:
    assert NEXT_WORLDS_ENV not in env((1, 3), 4, in_place=True)  # a crash's replacement: its peers wait for it
    assert NEXT_WORLDS_ENV not in env((1, 3), 4, restart_count=1)  # a restart round: every rank waits for it
    assert NEXT_WORLDS_ENV not in env((1, 3), 4, store="")  # no in-place resizes: nothing to warm
