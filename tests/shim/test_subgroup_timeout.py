"""The groups a script makes in `on_world` (its device mesh's) wait for a peer as long as the shim's own group."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from support.spawned import spawned

from trainer_shim.elastic import Elastic
from trainer_shim.noop import NullSession


def member(_proc: int, out: dict[int, Any]) -> None:
    made: list[timedelta] = []

    def on_world(_rank: int, _size: int) -> None:  # a 2-D mesh of one rank makes no group: a group as a mesh would
        group = dist.new_group([0])
        made.append(group._get_backend(torch.device("cpu")).options._timeout)

    elastic = Elastic(NullSession(), state_dict=dict, load_state_dict=lambda _s: None, on_world=on_world, timeout_s=7)
    elastic.init()
    later = dist.new_group([0])._get_backend(torch.device("cpu")).options._timeout
    out[0] = (made, later, c10d.default_pg_timeout)
    dist.destroy_process_group()


def test_a_scripts_subgroups_time_out_with_the_shims_group_not_after_half_an_hour() -> None:
    """A gloo send queued on a pair that had just failed waits for its group's timeout (seen in a crash soak: the
    survivor was replaced after its node's patience, its shards with it). The script's own groups now give up
    after the shim's `timeout_s`; groups made outside `on_world` keep c10d's default."""
    made, later, default = spawned(member, 1)[0]
    assert made == [timedelta(seconds=7)]
    assert later == default == timedelta(minutes=30)
