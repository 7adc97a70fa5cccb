"""A sharded step's update is applied on every rank or on none, when a node dies between two replicas' last syncs.

Rank 2 plays node b, holding the replica of rank 0's shard and of rank 1's (HSDP: ranks 0 and 1 are node a's
shard-mates). It finishes rank 1's gradient sync and dies before rank 0's: without the vote rank 1 would apply
step 1 while rank 0 stays at step 0, and no replica would be whole at either step.
"""

from __future__ import annotations

import os
import threading

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.optim.optimizer import register_optimizer_step_pre_hook

from trainer_shim.generation import Generation, join, open_store
from trainer_shim.peer_errors import lost_peer
from trainer_shim.step_commit import StepCommit


def hsdp_step(proc: int, store_addr: str, prefix: str, b_votes: bool, out: dict) -> None:
    store = open_store(store_addr, 30)
    join(Generation(1, proc, 3, store_addr, prefix), "gloo", store, 5)
    replicas = {0: dist.new_group([0, 2]), 1: dist.new_group([1, 2])}  # each of a's shards with b's copy of it
    vote = StepCommit(store, prefix, proc, 3, timeout_s=60)  # a lost voter is only ever told by the abort
    register_optimizer_step_pre_hook(lambda *_: vote.before_update(1))
    weight = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([weight], lr=0.5)
    weight.grad = torch.ones(2)
    if proc == 2:  # node b: rank 1's sync, then a power loss before rank 0's, or after both and its vote
        dist.all_reduce(torch.ones(2), group=replicas[1])
        if b_votes:
            dist.all_reduce(torch.ones(2), group=replicas[0])
            vote.before_update(1)
        os._exit(0)
    # The daemon's abort: it comes once b is declared lost, here once b's process is gone.
    daemon = open_store(store_addr, 60)
    aborter = threading.Thread(target=lambda: (daemon.wait(["lost"]), vote.aborted.set()))
    aborter.start()
    try:
        dist.all_reduce(weight.grad, group=replicas[proc])
        opt.step()
        out[proc] = ("applied", weight.tolist())
    except RuntimeError as exc:
        out[proc] = (type(exc).__name__ if lost_peer(exc) else repr(exc), weight.tolist())
    aborter.join()


def run(store_addr: str, prefix: str, b_votes: bool) -> dict:
    with mp.Manager() as manager:
        out = manager.dict()
        context = mp.start_processes(hsdp_step, args=(store_addr, prefix, b_votes, out), nprocs=3,
                                     start_method="spawn", join=False)
        context.processes[2].join(60)
        open_store(store_addr, 30).set("lost", "1")
        for proc in context.processes[:2]:
            proc.join(60)
        return dict(out)


def test_a_node_lost_between_two_replicas_syncs_leaves_every_survivor_at_the_same_step(store_addr: str) -> None:
    seen = run(store_addr, "test/torn", b_votes=False)
    assert seen[1] == ("StepNotApplied", [1.0, 1.0])  # its sync was done, its update is not applied
    assert seen[0][1] == [1.0, 1.0] and seen[0][0] != "applied"


def test_a_node_lost_after_every_rank_voted_leaves_every_survivor_updated(store_addr: str) -> None:
    seen = run(store_addr, "test/voted", b_votes=True)
    assert seen == {0: ("applied", [0.0, 0.0]), 1: ("applied", [0.0, 0.0])}
