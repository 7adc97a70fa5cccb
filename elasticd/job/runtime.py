"""Per-user runtime directory (ipc sockets, endpoint files) and this host's network: addresses, ports, interfaces."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

import psutil
import zmq

from elasticd.job.config import StartError
from elasticd.wire.protocol import Json


def runtime_dir() -> Path:
    explicit, xdg = os.environ.get("ELASTICD_RUNTIME_DIR"), os.environ.get("XDG_RUNTIME_DIR")
    if explicit:
        path = Path(explicit)
    else:
        path = Path(xdg) / "elasticd" if xdg else Path(tempfile.gettempdir()) / f"elasticd-{os.getuid()}"
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)  # ipc:// sockets live here: only this user may connect
    return path


# The soft limit on open files this daemon was started with; its workers get it back (see raise_open_file_limit).
_user_open_files: int | None = None
NR_OPEN = 1 << 20  # Linux's default fs.nr_open, the most a soft limit may be: plenty for any job


def raise_open_file_limit() -> tuple[int, int] | None:
    """Lift this process's soft limit on open files to the hard one, as the daemon may hold a connection per member
    (1,024, a common default, is below a coordinator's 2,048 without relays). Returns (was, now) when raised.
    Workers are the user's programs and may still use select(), which fails past fd 1,023: restore_open_file_limit
    gives them the limit they were started with."""
    global _user_open_files
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NR_OPEN if hard == resource.RLIM_INFINITY else min(hard, NR_OPEN)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # fs.nr_open lowered below the hard limit: keep what we have
        return None
    _user_open_files = soft
    return soft, target


def restore_open_file_limit() -> None:
    """In a child before it becomes a worker or the zygote: the soft limit the daemon was started with."""
    if _user_open_files is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (_user_open_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


NAME_MAX = 200  # bytes of a runtime file name, below the file system's 255 with room for suffixes


def node_file_stem(job_id: str, node_id: str) -> str:
    """`JOB--NODE` names this node's runtime files; a node id too long for a file name (a hostname may have
    253 characters) is replaced by its digest. The files' contents carry the ids themselves."""
    stem = f"{job_id}--{node_id}"
    return stem if len(stem.encode()) <= NAME_MAX else f"{job_id}--{id_digest(node_id)}"


def id_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def worker_socket(job_id: str, node_id: str, pid: int) -> str:
    """The worker channel's ipc:// path: short whatever the ids, since a Unix socket path has 107 bytes at most."""
    return str(runtime_dir() / f"w-{id_digest(f'{job_id}--{node_id}')}-{pid}.sock")


def endpoint_file(job_id: str, node_id: str) -> Path:
    return runtime_dir() / f"{node_file_stem(job_id, node_id)}.json"


class EndpointsFile(TypedDict, total=False):
    """A daemon's endpoints file (Daemon.announce writes it): which job and node, and where to reach it."""

    job_id: str
    node_id: str
    pid: int
    host: str
    coordinator: bool
    version: str
    control: str
    pub: str
    server_key: str  # "" without --keys


def write_endpoints(job_id: str, node_id: str, info: Mapping[str, Json]) -> Path:
    path = endpoint_file(job_id, node_id)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, path)
    return path


def remove_endpoints(job_id: str, node_id: str, pid: int) -> None:
    path = endpoint_file(job_id, node_id)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()


def live_daemons() -> list[EndpointsFile]:
    """Endpoint files of daemons still running; stale files (dead pid) are removed on the way."""
    found = []
    for path in sorted(runtime_dir().glob("*--*.json")):
        try:
            info: EndpointsFile = json.loads(path.read_text())  # as a daemon wrote it; a file without a pid is none
            pid = int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            found.append(info)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return found


def free_ports(count: int, host: str = "") -> list[int]:
    """Ports the kernel says are free now; the coordinator hands one to each round's rank 0."""
    socks, ports = [], []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            socks.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in socks:
            sock.close()
    return ports


def bind_in_range(sock: zmq.Socket, host: str, port_range: tuple[int, int] | None, what: str) -> str:
    """Bind tcp://host on the first free port of --port-range (an ephemeral one without it); the endpoint bound."""
    if port_range is None:
        sock.bind(f"tcp://{host}:*")
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)
    low, high = port_range
    for port in range(low, high + 1):
        try:
            sock.bind(f"tcp://{host}:{port}")
            return f"tcp://{host}:{port}"
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE:
                raise StartError(f"cannot bind {what} on tcp://{host}:{port}: {exc}") from None
    raise StartError(f"no free port for {what} in --port-range {low}-{high} on {host}")


def is_local_host(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET)
    except socket.gaierror:
        return False
    local = {addr.address for addrs in psutil.net_if_addrs().values() for addr in addrs}
    return any(str(info[4][0]) in local or str(info[4][0]).startswith("127.") for info in infos)


def advertised_addr(rdzv_host: str, override: str = "") -> str:
    """The address other nodes reach us on: the interface that routes to the rendezvous host."""
    if override:
        return override
    try:
        target = str(socket.getaddrinfo(rdzv_host, None, socket.AF_INET)[0][4][0])
    except socket.gaierror:
        return "127.0.0.1"
    if target.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((target, 9))  # UDP connect sends nothing; it only picks the route
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


# What gloo, NCCL and TensorPipe (torch.distributed.rpc) read to pick their interface; left unset, gloo takes the
# hostname's address, which is 127.0.0.1 on Debian-like hosts, so a worker on another host connects to itself.
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def interface_holding(addr: str) -> str | None:
    """The network interface this address is assigned to; None for a hostname or an address of another host."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family in (socket.AF_INET, socket.AF_INET6) and a.address.split("%")[0] == addr for a in addrs):
            return name
    return None


def socket_ifname_env(addr: str, environ: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """The *_SOCKET_IFNAME vars for workers naming the interface of `addr`, those the user set left alone; and why."""
    kept = [f"{var}={environ[var]}" for var in SOCKET_IFNAME_VARS if var in environ]
    kept_note = f"; kept {', '.join(kept)} from the environment" if kept else ""
    interface = interface_holding(addr)
    if interface is None:
        return {}, (f"no interface here holds {addr} (a hostname, or an address behind NAT?): workers' gloo/NCCL "
                    f"pick their own; set GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME if rounds cannot connect{kept_note}")
    env = {var: interface for var in SOCKET_IFNAME_VARS if var not in environ}
    if not env:
        return {}, f"workers use {', '.join(kept)} from the environment for gloo/NCCL"
    return env, f"workers use interface {interface} ({addr}) for gloo/NCCL{kept_note}"
