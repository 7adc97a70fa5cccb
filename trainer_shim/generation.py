"""One generation's process group: join it on the job's long-lived store and leave it (the state: trainer_shim.heal).

docs/architecture.md, "Generations". No daemon here: the functions work on any torch.distributed world, so
tests (and scripts/gpu_resize_check.sh) drive them directly.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.tensor._random as dtensor_random
from torch.distributed.tensor import DTensor

from trainer_shim.state_paths import Slot, flatten

STORE_ENV = "ELASTICD_STORE"  # host:port of the job's long-lived c10d store (hosted by the coordinator's daemon)
PREFIX_ENV = "ELASTICD_STORE_PREFIX"  # this generation's key prefix in it
DEFAULT_TIMEOUT_S = 10.0  # short: a peer that is alive but absent is only noticed at this timeout (gloo)
# How long a rank waits for the rest of its generation to arrive. Longer than the collectives' timeout: a
# newcomer's peers first finish their step, or are forked under load. A wait that is moot ends sooner: the
# daemon stops this process for a restart, or replaces it when it does not leave for a newer generation.
ARRIVAL_WAIT_S = 60.0
GENERATION_WAIT_S = 120.0  # out of any group (after leaving, or pre-started): one wait for the next generation


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


def arrive(gen: Generation, store: dist.Store, wait_s: float = ARRIVAL_WAIT_S, stage: str = "arrival") -> None:
    """Wait until every rank of the generation has reached `stage`, so that the collectives after it need only
    their short timeout: `arrival` before the group's init, `rebuilt` before a sharded heal (a newcomer builds its
    model for the first time there, which takes seconds on a loaded host while its peers wait in the heal).

    One counter per generation and stage: the last rank to count sets `all`, which the others wait for (one
    blocking wait: c10d logs a warning for every wait that times out, so there is no polling).
    """
    view = dist.PrefixStore(f"{gen.prefix}/{stage}", store)
    if view.add("count", 1) >= gen.world_size:
        view.set("all", "1")
    try:
        view.wait(["all"], timedelta(seconds=wait_s))
    except dist.DistStoreError:
        raise NotArrived(f"generation {gen.round}: {view.add('count', 0)} of {gen.world_size} ranks "
                         f"{'arrived' if stage == 'arrival' else 'reached ' + stage} within {wait_s:.0f}s") from None


def join(gen: Generation, backend: str, store: dist.Store, timeout_s: float,
         wait_s: float = ARRIVAL_WAIT_S) -> set[str]:
    """Init the default group of this generation on a fresh prefix (a reused one hangs, #55967), once every
    rank has arrived (`arrive`).

    Returns the sockets the group opened (its gloo pairs), for `leave` to sever.
    """
    arrive(gen, store, wait_s)
    before = _sockets().keys()
    dist.init_process_group(backend, store=dist.PrefixStore(gen.prefix, store), rank=gen.rank,
                            world_size=gen.world_size, timeout=timedelta(seconds=timeout_s))
    return set(_sockets().keys() - before)


def leave(backend: str, failed: bool, opened: set[str]) -> None:
    """Leave the current group. NCCL: finish queued kernels first, or abort after a failure (destroy can hang).

    gloo: destroy does not close the group while anything still holds it (DDP's hooks on the parameters do),
    so a peer blocked in a collective with us would wait for its timeout; shutting our pair sockets down makes
    it fail at once and leave too. Listening sockets are left alone (gloo aborts on a failed accept).
    """
    if not dist.is_initialized():
        return
    forget_rng_tracker()
    if backend == "nccl":
        if failed:
            dist.distributed_c10d._abort_process_group()
            return
        torch.cuda.synchronize()
    dist.destroy_process_group()
    sever(opened)


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
