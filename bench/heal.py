"""Heal benchmark: a join into a running world, at state sizes from 100 MB to 2 GB per replica, DDP and HSDP.

Every row is one join: the old world's ranks hold the state at step 10 (model + AdamW's two moments, a third
each), the newcomers hold a fresh model and no optimizer state (DDP) or a fresh sharded model and optimizer (HSDP,
2 shards per replica). All ranks form the new group, then heal; timed from the moment every rank is in it:
  heal       this tree (trainer_shim.heal): each newcomer receives what it lacks, point to point, from every rank
             holding it, into its own tensors; ranks holding the freshest step receive nothing. Every rank's
             staging buffers are touched before the clock, as an in-place worker's are at its start
  prepared   the same, each DDP newcomer pre-started as a joining node's is: before the join it read the state's
             size (published by rank 0 in the store) and touched memory for what it lacks (trainer_shim.prepared)
  drain      a world of survivors only (one rank of the old world gone), every rank at the freshest step: each
             rank's heal is its own summary and the one exchange of summaries (issue 35: at most 10 ms)
  broadcast  the tree before (--base-tree, its `generation.sync`): the freshest rank broadcasts its whole state
             to every rank, survivors included (DDP only: sharded state was not healed in place before)
  restart    the new world's ranks as new processes at once, each loading its part of the state from a
             checkpoint file in the page cache: process start, torch import, torch.load (what a restart costs
             at least, before any group forms)
  loopback   gloo send/recv of one tensor of the state's size between two processes: the physical limit here
             (the best of three)
Per row: newcomer_s (its heal), survivor_s (the slowest survivor's: it holds the freshest step), idle_survivor_s
(the slowest survivor that sent nothing, where one did: its cost is the heal's exchange alone), survivor_heal_s
(the slowest survivor's `heal` alone, as its `resize` event reports it: survivor_s also has the state's `flatten`
before it, and an HSDP rank's of its wanted state), world_s (until the last rank is done: the survivors' stall),
moved_bytes (all ranks' received bytes), GB/s (state per replica / newcomer_s) and its share of loopback, cpu_s
(every rank's CPU time in the heal, all its threads) and cpu_floor_s (cpu_s over the cores this process may use:
no heal on them can take less). --tensors sets how many tensors hold the same bytes (issue 35's axis). --phases
adds phases_ms: per role, the mean CPU of each of the heal's steps on its calling thread ("main": all the row
times there, the state's flatten included; "pump": the messages copied together and apart, of which "_scatter" is
the copy out) and of all its threads ("cpu").
Usage: heal.py [--sizes-mb 100,500,1000,2000] [--layouts ddp,hsdp] [--tensors 12,99,999,4998] [--base-tree DIR]
               [--heal-tree DIR] [--ddp-joins 1-2,2-3,4-5] [--no-restart] [--no-prepared] [--no-drains] [--own-specs]
               [--phases]
               [--out bench/results/heal.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 10.0  # the shim's collective timeout: a heal slower than this falls back to a restart
WORLDS = {"ddp": [(2, 3), (4, 5)], "hsdp": [(2, 4), (4, 6)]}  # (old, new): HSDP adds one replica of 2 shards
DRAINS = {"ddp": [(3, 2), (5, 4)], "hsdp": [(4, 2), (6, 4)]}  # (old, new): HSDP loses one replica
HEALS = ("heal", "prepared", "drain")  # the methods that run this tree's heal
SHARDS = 2
PHASES = {"trainer_shim.heal": ("_offers", "settle", "_structure", "_targets", "move"),  # as heal() calls them
          "trainer_shim.heal_moves": ("_scatter",)}  # a received message's copy out (inside `pump`)


@dataclass(frozen=True)
class Made:
    """How a row's state is made and what is measured: its tensor count, HSDP's specs, the heal's phases."""

    params: int = 4  # tensors of parameters, each with AdamW's two moments
    own_specs: bool = False
    phases: bool = False


def state_of(rank: int, nbytes: int, survivor: bool, layout: str, world: int,
             made: Made = Made()) -> tuple[dict, dict | None]:
    """(held, wants) for one rank: DDP holds whole tensors, HSDP its shard of each (DTensors on a 2-D mesh).
    `made.params` tensors of parameters, each with AdamW's two moments: 3 x that many tensors of the state's bytes.
    HSDP's same-shaped DTensors share one spec object, as FSDP2's do (DTensor's sharding propagation caches the
    specs it returns: `empty_like` here, FSDP2's own ops there); `made.own_specs` gives each its own instead."""
    params = made.params
    per = max(nbytes // 3 // 4 // params, 1)  # floats per tensor
    shard = layout == "hsdp"
    cols = min(1024, per)  # a small tensor (a bias, a norm's weight) is one row
    rows = max(per // cols // (SHARDS if shard else 1), 1)
    mesh = None
    if shard:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (world // SHARDS, SHARDS))

    first: list[Any] = []  # the first DTensor; the others are made like it and share one propagated spec

    def tensor(fill: float) -> torch.Tensor:
        if shard and first and not made.own_specs:
            like: Any = torch.empty_like(first[0])
            like.to_local().fill_(fill)  # touched, as a trained model's memory is
            return like
        local = torch.empty(rows, cols).fill_(fill)
        if not shard:
            return local
        from torch.distributed.tensor import DTensor, Replicate, Shard
        first.append(DTensor.from_local(local, mesh, [Replicate(), Shard(0)], run_check=False,
                                        shape=torch.Size((rows * SHARDS, cols)), stride=(cols, 1)))
        return first[-1]

    model = {f"w{i}": tensor(rank + 1.0) for i in range(params)}
    if survivor or shard:
        opt = {i: {"exp_avg": tensor(0.5), "exp_avg_sq": tensor(0.25), "step": torch.tensor(10.0)}
               for i in range(params)}
    else:
        opt = {}  # a newcomer's AdamW has no state before its first step
    state = {"model": model, "opt": {"state": opt, "param_groups": [{"lr": 1e-3, "params": list(range(params))}]}}
    return state, (state if shard else None)


def member(rank: int, method: str, layout: str, old: int, new: int, nbytes: int, addr: str, out: dict,
           made: Made) -> None:
    # First, as an in-place worker does at its start: the zeroing's threads (trainer_shim.heal_moves.touch) then finish
    # long before the clock, not in the first milliseconds of a heal that costs a few.
    staging = warm_staging() if method in HEALS else None
    store = dist.TCPStore("127.0.0.1", int(addr), is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=new, timeout=timedelta(seconds=TIMEOUT_S))
    survivor = rank < old
    held, wants = state_of(rank, nbytes, survivor, layout, new, made)
    cpu = torch.device("cpu")
    prepared = None
    if method in HEALS:
        from trainer_shim import heal as shim_heal  # imported before the clock starts, as a worker has it
        from trainer_shim.state_paths import flatten
        if method == "prepared":  # before the clock, as a pre-started worker does while the job trains
            prepared = prepare_newcomer(rank, survivor, held, store, addr)
    else:
        from trainer_shim.generation import sync
    phases: dict[str, float] = {}
    if made.phases and method in HEALS:
        time_phases(phases)
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()  # the process's CPU: every thread, gloo's included
    main_start = time.thread_time()
    received, sent, error, own = 0, 0, "", 0.0
    try:
        if method in HEALS:
            tensors: dict[str, torch.Tensor] = {}
            skeleton = flatten(held, tensors)
            if layout == "hsdp" and not survivor:
                tensors = {}
            healed, _ = shim_heal.heal(10 if survivor else 0, tensors, skeleton,
                                       None if wants is None else shim_heal_targets(wants), cpu, True, prepared,
                                       **({"staging": staging} if staging is not None else {}))
            received, sent, own = healed.received_bytes, healed.sent_bytes, healed.seconds
        else:  # the tree before: one broadcast of the whole state from the freshest rank
            synced = sync(10 if survivor else 0, lambda: held, cpu, cpu)
            received = 0 if synced.state is None else nbytes
    except RuntimeError as exc:
        error = str(exc).splitlines()[0][:200]
    mine, cpu_used = time.perf_counter() - start, time.process_time() - cpu_start
    phases["main"] = time.thread_time() - main_start
    own = own if method in HEALS else mine  # the broadcast has no parts to tell apart
    times: list[Any] = [None] * new
    # after the clock: not part of the heal
    dist.all_gather_object(times, {"seconds": mine, "survivor": survivor, "received": received, "error": error,
                                   "sent": sent, "cpu": cpu_used, "heal": own, "phases": phases})
    if rank == 0:
        out["result"] = times
    dist.destroy_process_group()


def time_phases(into: dict[str, float]) -> None:
    """Add each of the heal's steps' CPU on the calling thread to `into` by name (--phases; each step's own CPU:
    a wait in a collective costs none). Names a tree lacks are skipped."""
    import importlib

    def timed(fn: Any, name: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            begun = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                into[name] = into.get(name, 0.0) + time.thread_time() - begun
        return run

    for module_name, names in PHASES.items():
        module = importlib.import_module(module_name)
        for name in names:
            if hasattr(module, name):
                setattr(module, name, timed(getattr(module, name), name))
    posts = getattr(importlib.import_module("trainer_shim.heal_moves"), "_Posts", None)
    if posts is not None:  # the messages copied together or apart: a sender's copy in, a receiver's copy out
        posts.pump = timed(posts.pump, "pump")


def prepare_newcomer(rank: int, survivor: bool, held: dict, store: dist.Store, addr: str) -> Any:
    """Rank 0 publishes the state's size, as after a generation's first step; each newcomer prepares from it."""
    from elasticd.wire.names import JOB_STORE_ENV
    from trainer_shim.prepared import prepare, publish

    try:
        from trainer_shim.heal_moves import touch
    except ImportError:  # a tree before trainer_shim.heal_moves
        from trainer_shim.heal import touch  # type: ignore[attr-defined,no-redef]

    if rank == 0:
        publish(store, "bench", lambda: held)
    dist.barrier()
    return None if survivor else prepare({JOB_STORE_ENV: f"127.0.0.1:{addr}/bench"}, lambda: held,
                                         torch.device("cpu"), touch)


def warm_staging() -> Any:
    """This process's staging buffers, touched as every in-place worker's are at its start (None: a tree before)."""
    try:
        from trainer_shim.heal_moves import MESSAGE_BYTES, touch
        from trainer_shim.staging import Staging
    except ImportError:
        return None
    staging = Staging(MESSAGE_BYTES)
    staging.warm(touch)
    return staging


def shim_heal_targets(state: dict) -> dict[str, torch.Tensor]:
    from trainer_shim.state_paths import flatten
    tensors: dict[str, torch.Tensor] = {}
    flatten(state, tensors)
    return tensors


def run_join(method: str, layout: str, old: int, new: int, nbytes: int, made: Made) -> dict[str, Any]:
    server = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=60))
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(member, nprocs=new, start_method="spawn",
                           args=(method, layout, old, new, nbytes, str(server.port), out, made))
        times = out["result"]
    survivors = [r for r in times if r["survivor"]]
    newcomers = [r for r in times if not r["survivor"]]
    newcomer = max((r["seconds"] for r in newcomers), default=None)
    idle = [r["seconds"] for r in survivors if not r["received"] and not r["sent"]] \
        if method == "heal" else []  # a survivor that moved nothing: its cost is the exchange alone
    errors = sorted({r["error"] for r in times if r["error"]})
    cpu_s = sum(r["cpu"] for r in times)
    row = {"method": method, "layout": layout, "old": old, "new": new, "state_mb": nbytes >> 20,
           "tensors": 3 * made.params, **({"own_specs": made.own_specs} if layout == "hsdp" else {}),
           "survivor_s": round(max(r["seconds"] for r in survivors), 4),
           "survivor_heal_s": round(max(r["heal"] for r in survivors), 4),
           "idle_survivor_s": round(max(idle), 4) if idle else None,
           "newcomer_s": None if newcomer is None else round(newcomer, 3),
           "world_s": round(max(r["seconds"] for r in times), 3),
           "moved_bytes": sum(r["received"] for r in times), "errors": errors, "cpu_s": round(cpu_s, 4),
           "cpu_floor_s": round(cpu_s / len(os.sched_getaffinity(0)), 4)}
    if made.phases:
        roles = {"survivor": survivors, "newcomer": newcomers}
        row["phases_ms"] = {role: phase_means(ranks) for role, ranks in roles.items() if ranks}
    return row


def phase_means(ranks: list[dict[str, Any]]) -> dict[str, float]:
    """Each phase's CPU on the heal's thread, averaged over these ranks, in ms; `cpu` all of each's threads."""
    names = sorted({name for r in ranks for name in r["phases"]})
    means = {name: 1e3 * sum(r["phases"].get(name, 0.0) for r in ranks) / len(ranks) for name in names}
    means["cpu"] = 1e3 * sum(r["cpu"] for r in ranks) / len(ranks)
    return {name: round(v, 2) for name, v in means.items()}


def loopback_peer(rank: int, nbytes: int, addr: str, out: dict) -> None:
    store = dist.TCPStore("127.0.0.1", int(addr), is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    t = torch.empty(nbytes // 4).fill_(1.0)
    dist.barrier()
    start = time.perf_counter()
    dist.send(t, 1) if rank == 0 else dist.recv(t, 0)
    dist.barrier()
    if rank == 1:
        out["s"] = time.perf_counter() - start
    dist.destroy_process_group()


def run_loopback(nbytes: int) -> float:
    server = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=60))
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(loopback_peer, args=(nbytes, str(server.port), out), nprocs=2, start_method="spawn")
        return float(out["s"])


def run_restart(nbytes: int, layout: str, new: int, folder: Path) -> float:
    """Seconds until every new process has its part loaded (all started at once, as a restart does)."""
    part = nbytes // (SHARDS if layout == "hsdp" else 1)
    path = folder / f"state-{part}.pt"
    if not path.exists():
        torch.save({"t": torch.empty(part // 4).fill_(1.0)}, path)
    code = f"import torch; torch.load({str(path)!r})"
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(new)]
    for p in procs:
        p.wait()
    return time.perf_counter() - start


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--sizes-mb", default="100,500,1000,2000")
    parser.add_argument("--layouts", default="ddp,hsdp")
    parser.add_argument("--base-tree", default="", help="the checkout whose broadcast is compared (the tree before)")
    parser.add_argument("--tensors", default="12", help="tensors in the state, model and AdamW's moments "
                        "together (a multiple of 3), e.g. 12,99,999,4998: the heal's cost against the tensor count "
                        "at fixed bytes")
    parser.add_argument("--heal-tree", default=str(ROOT), help="the checkout whose heal is measured (side by side: "
                        "run once per tree, alternating)")
    parser.add_argument("--no-restart", action="store_true", help="skip the restart lower bound (seconds a row)")
    parser.add_argument("--no-prepared", action="store_true", help="skip the pre-started newcomer's rows (a tree "
                        "without trainer_shim.prepared)")
    parser.add_argument("--own-specs", action="store_true", help="give each HSDP DTensor its own spec object (FSDP2 "
                        "shares one among same-shaped tensors, as this benchmark does by default)")
    parser.add_argument("--phases", action="store_true", help="time the heal's steps on each rank's calling thread "
                        "(CPU: the exchange, plan, structure, targets, move, and within it the messages' copies) "
                        "and report their means per role, in ms")
    parser.add_argument("--no-drains", action="store_true", help="skip the drains' rows (a world of survivors only)")
    parser.add_argument("--warm-gb", type=float, default=0.0, help="touch this much memory once before measuring: "
                        "a VM may back memory only when first touched (0.8 s a GB on the 2-core machine), which then "
                        "lands inside the first heals that use it")
    parser.add_argument("--ddp-joins", default=",".join(f"{o}-{n}" for o, n in WORLDS["ddp"]),
                        help="the DDP joins, old-new: 1-2 gives each process a core of this 2-core machine")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "heal.json"))
    args = parser.parse_args()
    if args.base_tree and "def sync(" not in _read(Path(args.base_tree) / "trainer_shim" / "generation.py"):
        parser.error(f"--base-tree {args.base_tree}: no trainer_shim.generation.sync there, the whole-state broadcast "
                     "compared against (a tree before 8a51337 has it)")
    # Every process runs one intra-op thread, as elasticd's workers do (and torchrun's): with more, each new
    # group's gloo threads start an OpenMP team at their first copy, 10-30 ms a heal that no worker pays.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows: list[dict[str, Any]] = []
    sizes = [int(s) << 20 for s in args.sizes_mb.split(",")]
    if args.warm_gb:
        torch.empty(int(args.warm_gb * (1 << 30)), dtype=torch.uint8).zero_()
    loopback = {n: min(run_loopback(n) for _ in range(3)) for n in sizes}  # its best: the physical limit
    folder = Path(tempfile.mkdtemp(prefix="heal-bench-"))
    for layout in args.layouts.split(","):
        joins = [tuple(map(int, j.split("-"))) for j in args.ddp_joins.split(",")] if layout == "ddp" \
            else WORLDS[layout]
        changes = [(old, new, False) for old, new in joins] \
            + ([] if args.no_drains else [(old, new, True) for old, new in DRAINS[layout]])
        for old, new, drain in changes:
            for nbytes, count in ((n, int(t) // 3) for n in sizes for t in args.tensors.split(",")):
                # The broadcast holds the state about three times per rank (a flat copy, then new tensors).
                fits = new * 3 * nbytes < 0.7 * psutil.virtual_memory().total
                methods = ["drain"] if drain else ["heal"] \
                    + (["prepared"] if layout == "ddp" and not args.no_prepared else []) \
                    + (["broadcast"] if args.base_tree and layout == "ddp" and fits else [])
                for method in methods:
                    env_tree = args.base_tree if method == "broadcast" else args.heal_tree
                    os.environ["PYTHONPATH"] = env_tree  # spawned members import the tree under test
                    sys.path.insert(0, env_tree)
                    row = run_join(method, layout, old, new, nbytes, Made(count, args.own_specs, args.phases))
                    sys.path.remove(env_tree)
                    if not drain:
                        row["gbps"] = round(nbytes / row["newcomer_s"] / 1e9, 3)
                        row["loopback_gbps"] = round(nbytes / loopback[nbytes] / 1e9, 3)
                        row["of_loopback"] = round(row["gbps"] / row["loopback_gbps"], 3)
                        if not args.no_restart:
                            row["restart_s"] = round(run_restart(nbytes, layout, new, folder), 3)
                    row["load"] = round(os.getloadavg()[0], 2)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": {"cpus": psutil.cpu_count(), "python": platform.python_version(),
                                                      "torch": torch.__version__}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
