"""`elasticd start`: torchrun's flags (dash and underscore forms) plus ours, into a JobConfig."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

from elasticd.config import (
    ConfigError,
    JobConfig,
    check_node_id,
    default_node_id,
    parse_endpoint,
    parse_nnodes,
)


def add_start_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("start", help="supervise this node's workers (replaces torchrun)",
                       description="Run SCRIPT (or -m MODULE) on this node as part of an elastic job.")

    def flag(name: str, **kw: Any) -> None:
        names = [f"--{name}"] + ([f"--{name.replace('-', '_')}"] if "-" in name else [])
        p.add_argument(*names, **kw)

    flag("nnodes", default="1", help="N or MIN:MAX nodes (default 1)")
    flag("nproc-per-node", default="1", help="workers on this node (default 1)")
    flag("rdzv-endpoint", default="", help="HOST:PORT of the coordinator (the first daemon on that host binds it)")
    flag("rdzv-id", default="", help="job id shared by every node of the job")
    flag("rdzv-backend", default="elasticd", help="accepted for torchrun compatibility; elasticd has its own")
    flag("max-restarts", type=int, default=0, help="failure restarts allowed before the job fails (default 0)")
    flag("standalone", action="store_true", help="a single-node job on a free local port")
    flag("node-id", default="", help="unique node name (default: the hostname)")
    flag("local-addr", default="", help="address other nodes reach this node on (default: auto)")
    flag("grace-period", type=float, default=5.0, help="seconds from SIGTERM to SIGKILL for workers (default 5)")
    flag("log-dir", default="elastic-logs", help="worker logs, one file per worker per round")
    flag("join-timeout", type=float, default=600.0, help="seconds to wait below min nodes before failing")
    flag("hang-timeout", type=float, default=60.0, help="seconds without a shim step report before a hang restart")
    flag("exit-timeout", type=float, default=300.0, help="once a worker finished (exit 0), seconds its peers get "
         "to exit before they are stopped (a hung teardown must not keep the job alive)")
    flag("connect-timeout", type=float, default=60.0, help="seconds to reach the coordinator before giving up")
    flag("control", default="", help="control ROUTER address (tcp://... or ipc://...; default: a free loopback port)")
    flag("pub", default="", help="telemetry PUB address (default: a free loopback port)")
    flag("heartbeat", type=float, default=1.0, help="seconds between node heartbeats (lost after 3 misses)")
    flag("keys", default=os.environ.get("ELASTICD_KEYS", ""),
         help="CURVE key store (see `elasticd keys`): encrypts and authenticates every socket")
    flag("insecure", action="store_true", help="allow binding a non-loopback address without --keys (dangerous)")
    flag("no-zygote", action="store_true", help="exec a fresh interpreter per worker instead of forking "
         "from one that pre-imported torch (slower restarts)")
    flag("preload", default="torch,torch.distributed,torch.nn.parallel,torch._dynamo",
         help="modules the zygote imports once for every worker (comma-separated)")
    p.add_argument("-m", "--module", action="store_true", help="treat SCRIPT as a Python module, like python -m")
    p.add_argument("script", metavar="SCRIPT", help="training script (or module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def config_from_args(ns: argparse.Namespace) -> tuple[JobConfig, float]:
    low, high = parse_nnodes(ns.nnodes)
    nproc = ns.nproc_per_node
    if nproc in ("auto", "cpu", "gpu"):
        nproc = str(_auto_nproc(nproc))
    if not str(nproc).isdigit() or int(nproc) < 1:
        raise ConfigError(f"--nproc-per-node must be a positive integer or auto, got {nproc!r}")
    if ns.standalone:
        if low != 1 or high != 1:
            raise ConfigError("--standalone is a single-node job: drop --nnodes or set it to 1")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            host, port = "127.0.0.1", s.getsockname()[1]
        job_id = ns.rdzv_id or uuid.uuid4().hex[:8]
    else:
        if not ns.rdzv_endpoint:
            if high > 1:
                raise ConfigError("--rdzv-endpoint HOST:PORT is required for a multi-node job (or use --standalone)")
            ns.rdzv_endpoint = "127.0.0.1:29400"
        host, port = parse_endpoint(ns.rdzv_endpoint)
        job_id = ns.rdzv_id or "default"
    if not ns.module and not Path(ns.script).is_file():
        raise ConfigError(f"training script {ns.script!r} does not exist")
    for name in ("grace_period", "join_timeout", "hang_timeout", "exit_timeout", "connect_timeout", "heartbeat"):
        if getattr(ns, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive")
    if ns.max_restarts < 0:
        raise ConfigError("--max-restarts must be 0 or more")
    entry = (["-m", ns.script] if ns.module else [ns.script]) + list(ns.script_args)
    cfg = JobConfig(
        min_nodes=low, max_nodes=high, nproc_per_node=int(nproc), rdzv_host=host, rdzv_port=port,
        job_id=check_node_id(job_id), node_id=check_node_id(ns.node_id or default_node_id()), entry=entry,
        max_restarts=ns.max_restarts, grace_s=ns.grace_period, log_dir=os.path.abspath(ns.log_dir),
        join_timeout_s=ns.join_timeout, hang_timeout_s=ns.hang_timeout, exit_timeout_s=ns.exit_timeout,
        heartbeat_s=ns.heartbeat,
        local_addr=ns.local_addr, control_bind=ns.control, pub_bind=ns.pub, zygote=not ns.no_zygote,
        preload=ns.preload, keys_dir=ns.keys, insecure=ns.insecure,
    )
    check_exposure(cfg)
    return cfg, ns.connect_timeout


def check_exposure(cfg: JobConfig) -> None:
    """A steering API reachable from the network with no keys lets anyone kill the job: refuse it."""
    exposed = [addr for addr in (cfg.control_bind, cfg.pub_bind) if _non_loopback(addr)]
    if cfg.max_nodes > 1 and not _loopback_host(cfg.rdzv_host):
        exposed.append(f"rendezvous {cfg.rdzv_host}:{cfg.rdzv_port}")
    if not exposed or cfg.keys_dir:
        return
    if not cfg.insecure:
        raise ConfigError(f"{', '.join(exposed)} is reachable from the network and --keys is not set; create keys "
                          "with `elasticd keys init` (see README), or pass --insecure to accept the risk")
    print("elasticd start: WARNING: --insecure: anyone who can reach " + ", ".join(exposed) + " can steer or kill "
          "this job, and traffic is not encrypted", file=sys.stderr, flush=True)


def _non_loopback(addr: str) -> bool:
    if not addr.startswith("tcp://"):
        return False
    return not _loopback_host(addr[len("tcp://"):].rpartition(":")[0].strip("[]"))


def _loopback_host(host: str) -> bool:
    if host in ("localhost", "::1"):
        return True
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def _auto_nproc(kind: str) -> int:
    if kind in ("auto", "gpu"):
        try:
            import torch  # only here: `auto` asks torch for the GPU count, as torchrun does

            if torch.cuda.is_available():
                return torch.cuda.device_count()
        except ImportError:
            pass
    return os.cpu_count() or 1
