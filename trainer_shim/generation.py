"""One generation's process group: join it on the job's long-lived store and leave it (the state: trainer_shim.heal).

docs/architecture.md, "Generations". No daemon here: the functions work on any torch.distributed world, so
tests (and scripts/gpu_resize_check.sh) drive them directly.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.distributed.tensor._random as dtensor_random
from torch.distributed.tensor import DTensor

from elasticd.wire.names import job_prefix
from trainer_shim.state_paths import Slot, flatten

STORE_ENV = "ELASTICD_STORE"  # host:port of the job's long-lived c10d store (hosted by the coordinator's daemon)
PREFIX_ENV = "ELASTICD_STORE_PREFIX"  # this generation's key prefix in it
DEFAULT_TIMEOUT_S = 10.0  # short: a peer that is alive but absent is only noticed at this timeout (gloo)
# How long a rank waits for the rest of its generation to arrive. Longer than the collectives' timeout: a
# newcomer's peers first finish their step, or are forked under load. A wait that is moot ends sooner: the
# daemon stops this process for a restart, or replaces it when it does not leave for a newer generation.
ARRIVAL_WAIT_S = 60.0
GENERATION_WAIT_S = 120.0  # out of any group (after leaving, or pre-started): one wait for the next generation
RECONFIGURE_ENV = "ELASTICD_RECONFIGURE"  # "0": re-init the group every generation even where c10d can reconfigure


@dataclass(frozen=True)
class Generation:
    """Where and as whom a worker joins: the round is the generation number."""

    round: int
    rank: int
    world_size: int
    store: str
    prefix: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Generation | None:
        """The worker's first generation, from its environment; None without a job store (plain torchrun)."""
        if not env.get(STORE_ENV) or not env.get(PREFIX_ENV):
            return None
        return cls(int(env.get("ELASTICD_ROUND", "0")), int(env["RANK"]), int(env["WORLD_SIZE"]), env[STORE_ENV],
                   env[PREFIX_ENV])

    @property
    def job_prefix(self) -> str:
        """The job's own keys, above every generation's."""
        return job_prefix(self.prefix)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Generation:
        """A `generation` message of the worker channel (docs/worker-channel.md)."""
        return cls(int(body["round"]), int(body["rank"]), int(body["world_size"]), str(body["store"]),
                   str(body["prefix"]))


def open_store(addr: str, timeout_s: float) -> dist.Store:
    """A client of the job's store; one per process, reused by every generation under its own prefix."""
    host, _, port = addr.rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


_FD_DIR = "/proc/self/fd"


def _sockets() -> dict[str, int]:
    """This process's sockets: 'socket:[inode]' -> fd (Linux; elsewhere none, and leaving relies on destroy)."""
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(_FD_DIR):
            with contextlib.suppress(OSError):
                link = os.readlink(f"{_FD_DIR}/{name}")
                if link.startswith("socket:"):
                    found[link] = int(name)
    return found


def sockets_now() -> set[str]:
    """This process's sockets now ('socket:[inode]'): a script's subgroups (a device mesh's) open theirs in
    `on_world`, and `leave`/`abort` sever those too."""
    return set(_sockets())


class NotArrived(RuntimeError):
    """The generation's other ranks did not all arrive in time: the daemon restarts this process instead."""


def arrive(gen: Generation, store: dist.Store, wait_s: float = ARRIVAL_WAIT_S, stage: str = "arrival",
           meanwhile: Callable[[], None] | None = None) -> None:
    """Wait until every rank of the generation has reached `stage`, so that the collectives after it need only
    their short timeout: `arrival` before the group's init, `rebuilt` before a sharded heal (a newcomer builds its
    model for the first time there, which takes seconds on a loaded host while its peers wait in the heal).

    One counter per generation and stage: the last rank to count sets `all`, which the others wait for (one
    blocking wait: c10d logs a warning for every wait that times out, so there is no polling). `meanwhile`: this
    rank's own work after it counted, which the wait for slower ranks hides.
    """
    view = dist.PrefixStore(f"{gen.prefix}/{stage}", store)
    if view.add("count", 1) >= gen.world_size:
        view.set("all", "1")
    if meanwhile is not None:
        meanwhile()
    try:
        view.wait(["all"], timedelta(seconds=wait_s))
    except dist.DistStoreError:
        raise NotArrived(f"generation {gen.round}: {view.add('count', 0)} of {gen.world_size} ranks "
                         f"{'arrived' if stage == 'arrival' else 'reached ' + stage} within {wait_s:.0f}s") from None


def can_reconfigure(backend: str) -> bool:
    """This process can move its group to the next generation with c10d's `reconfigure` (torch 2.14 and newer,
    gloo; NCCL refuses it there): the group object stays, only its peers change. `ELASTICD_RECONFIGURE=0` opts
    out (a side-by-side measurement)."""
    return (backend == "gloo" and os.environ.get(RECONFIGURE_ENV, "1") != "0"
            and hasattr(dist.ProcessGroup, "reconfigure")
            and "enable_reconfigure" in inspect.signature(dist.init_process_group).parameters)


def join(gen: Generation, backend: str, store: dist.Store, timeout_s: float,
         wait_s: float = ARRIVAL_WAIT_S) -> set[str]:
    """Join this generation's default group once every rank has arrived (`arrive`): by `reconfigure` where every
    rank can (`can_reconfigure`), else by an init on the generation's fresh prefix (a reused one hangs, #55967).
    A rank that cannot says so before it counts itself in, so every rank reads the same answer after `arrive`.

    Returns the sockets the group opened (its gloo pairs), for `leave` to sever.
    """
    able = can_reconfigure(backend)
    arrival = dist.PrefixStore(f"{gen.prefix}/arrival", store)
    if not able:
        arrival.add("plain", 1)
    arrive(gen, store, wait_s)
    before = _sockets().keys()
    if able and arrival.add("plain", 0) == 0:
        _reconfigure(gen, backend, store, timeout_s)
    else:
        if dist.is_initialized():  # a group kept for `reconfigure`, which a peer of this generation cannot do
            dist.destroy_process_group()
        dist.init_process_group(backend, store=dist.PrefixStore(gen.prefix, store), rank=gen.rank,
                                world_size=gen.world_size, timeout=timedelta(seconds=timeout_s))
    return set(_sockets().keys() - before)


@dataclass
class _Kept:
    """The default group `reconfigure` moves from one generation to the next (one per process)."""

    group: dist.ProcessGroup
    names: int  # c10d's group counter just after the group's init: where every process's subgroup names start


_kept: _Kept | None = None


def _keeps_group() -> bool:
    return _kept is not None and dist.is_initialized() and c10d._get_default_group() is _kept.group


def _reconfigure(gen: Generation, backend: str, store: dist.Store, timeout_s: float) -> None:
    """Move the kept group to this generation (a new process first makes one, in reconfigure mode, on the job's
    keys: every rank's `reconfigure` meets there). Each rank posts its handle; the list in rank order is the map."""
    global _kept
    timeout = timedelta(seconds=timeout_s)
    if not _keeps_group():
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group(backend, store=dist.PrefixStore(f"{gen.job_prefix}/group", store), rank=gen.rank,
                                world_size=gen.world_size, timeout=timeout,
                                enable_reconfigure=True)  # type: ignore[call-arg,unused-ignore]  # torch >= 2.14
        _kept = _Kept(c10d._get_default_group(), c10d._world.group_count)
    assert _kept is not None
    handles = dist.PrefixStore(f"{gen.prefix}/handles", store)
    handles.set(str(gen.rank), _kept.group.get_reconfigure_handle())  # type: ignore[attr-defined,unused-ignore]
    ranks = [str(r) for r in range(gen.world_size)]
    handles.wait(ranks, timeout)
    order = [h.decode() for h in handles.multi_get(ranks)]
    c10d._reconfigure(uuid=gen.round, handles=order, timeout=timeout).wait()  # type: ignore[attr-defined,unused-ignore]
    # c10d's bookkeeping follows the new peers (private fields: no API sets them): subgroups (a device mesh's) take
    # their keys under this generation's prefix, and names from where a new process's start, so that survivors
    # and newcomers name them alike; the group's rank map has the new size.
    world = c10d._world
    world.pg_map[_kept.group] = (world.pg_map[_kept.group][0], dist.PrefixStore(gen.prefix, store))
    world.pg_group_ranks[_kept.group] = {r: r for r in range(gen.world_size)}
    world.group_count = _kept.names


def leave(backend: str, failed: bool, opened: set[str]) -> None:
    """Leave the current group. NCCL: finish queued kernels first, or abort after a failure (destroy can hang).

    gloo: destroy does not close the group while anything still holds it (DDP's hooks on the parameters do),
    so a peer blocked in a collective with us would wait for its timeout; shutting our pair sockets down makes
    it fail at once and leave too. Listening sockets are left alone (gloo aborts on a failed accept). A group
    kept for `reconfigure` stays; the generation's subgroups go.
    """
    if not dist.is_initialized():
        return
    forget_rng_tracker()
    if backend == "nccl":
        if failed:
            dist.distributed_c10d._abort_process_group()
            return
        torch.cuda.synchronize()
        _destroy()
        sever(opened)
        return
    # Severed first: gloo's destroy waits on pairs that its peers still hold open (20-40 ms at 4 ranks here,
    # bench/group_switch.py), and ~10 ms once every peer has shut them down.
    sever(opened)
    _destroy()


def _destroy() -> None:
    """Destroy this generation's groups; a group kept for `reconfigure` stays, for the next generation."""
    if _keeps_group():
        for group in [g for g in c10d._world.pg_map if g is not c10d._get_default_group()]:
            dist.destroy_process_group(group)
    else:
        dist.destroy_process_group()


def forget_rng_tracker() -> None:
    """Drop DTensor's RNG tracker (CUDA only): it holds this group's mesh, and the first random DTensor op of a
    process without one broadcasts rank 0's RNG state over the world. A survivor that kept its tracker would skip
    that broadcast where a newcomer makes it (`init_weights` in `on_world`): a hang on the next collective."""
    dtensor_random._rng_tracker = None


def abort(backend: str, opened: set[str]) -> None:
    """A peer is gone (the daemon said so): this rank's blocked collective fails now, not at the group's timeout.
    NCCL: abort the communicator (`ProcessGroup.abort`); gloo: sever the group's sockets."""
    if not dist.is_initialized():
        return
    if backend == "nccl":
        group = dist.group.WORLD
        if group is not None:
            group.abort()
        return
    sever(opened)


@contextlib.contextmanager
def subgroup_timeout(seconds: float) -> Iterator[None]:
    """Groups made meanwhile (the script's device mesh's) wait `seconds` for a peer, as the generation's own group
    does, not c10d's 30 minutes. A gloo send queued on a pair that had just failed is not woken by severing its
    socket: it waits for its group's timeout (gdb: `UnboundBuffer::waitSend` in a ring all-reduce; gloo's
    `Pair::signalException` wakes no unbound buffer's send in its transmit queue). Seen in 3 of 130 crashes here
    (bench/results/crash-soak.md); with 30 minutes its node replaced it, its shards with it."""
    saved = c10d.default_pg_timeout
    c10d.default_pg_timeout = timedelta(seconds=seconds)
    try:
        yield
    finally:
        c10d.default_pg_timeout = saved


def sever(opened: set[str]) -> None:
    """Shut down the group's own TCP sockets: a peer (or this rank) blocked in a collective on them fails at once."""
    for link, fd in _sockets().items():
        if link not in opened:
            continue
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
            if sock.family in (socket.AF_INET, socket.AF_INET6) \
                    and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                sock.shutdown(socket.SHUT_RDWR)


def state_digest(state: Any) -> str:
    """sha256 over every tensor's bytes in state order (a DTensor's local shard), and the rest's repr: equal
    digests, bitwise-equal state."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = flatten(state, tensors)
    h = hashlib.sha256(repr(_shape(skeleton)).encode())
    for t in tensors.values():
        local = t.to_local() if isinstance(t, DTensor) else t
        h.update(local.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _shape(skeleton: Any) -> Any:
    if isinstance(skeleton, Slot):
        return ("tensor", skeleton.path)
    if isinstance(skeleton, dict):
        return sorted((str(k), _shape(v)) for k, v in skeleton.items())
    if isinstance(skeleton, list | tuple):
        return [_shape(v) for v in skeleton]
    return skeleton
