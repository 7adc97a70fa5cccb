"""`elasticd start`: torchrun's flags (dash and underscore forms) plus ours, into a JobConfig."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import socket
import string
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticd.cli.scheduler import apply_slurm
from elasticd.cli.torchrun_flags import Default, add_torchrun_flags, torchrun_values
from elasticd.cli.torchrun_parse import Setting, console_ranks, parse_rdzv_conf, parse_signals
from elasticd.coordinator.goodput import WINDOW_S
from elasticd.job.config import (
    DEFAULT_LEAVE_SIGNALS,
    DEFAULT_PRELOAD,
    ConfigError,
    EtcdAccess,
    JobConfig,
    check_job_id,
    check_node_id,
    default_node_id,
    parse_alert,
    parse_endpoint,
    parse_endpoints,
    parse_metrics_port,
    parse_nnodes,
    parse_port_range,
)
from elasticd.job.runtime import is_local_host
from elasticd.member.output_metrics import compile_pattern
from elasticd.wire.names import EventKind

# Our own settings that torchrun flags can also set (--shutdown-timeout, --rdzv-conf): None means "not given".
TIMEOUT_DEFAULTS = {"grace_period": 5.0, "join_timeout": 600.0, "hang_timeout": 60.0, "exit_timeout": 300.0,
                    "connect_timeout": 60.0, "heartbeat": 1.0}


def add_start_parser(sub: argparse._SubParsersAction, root: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = sub.add_parser("start", help="supervise this node's workers (replaces torchrun)",
                       description="Run SCRIPT (or -m MODULE) on this node as part of an elastic job. "
                       "Takes torchrun's whole command line and its PET_* variables (docs/torchrun-compat.md).")

    def flag(name: str, **kw: Any) -> None:
        names = [f"--{name}"] + ([f"--{name.replace('-', '_')}"] if "-" in name else [])
        default = TIMEOUT_DEFAULTS.get(name.replace("-", "_"))
        if default is not None:
            kw.update(type=float, default=None, help=f"{kw['help']} (default {default:g})")
        p.add_argument(*names, **kw)

    add_torchrun_flags(p, root)
    flag("node-id", default=Default(""), help="unique node name (default: the hostname; under SLURM, its node name)")
    flag("grace-period", help="seconds from SIGTERM to SIGKILL for workers")
    flag("join-timeout", help="seconds to wait below min nodes before failing")
    flag("hang-timeout", help="seconds without a shim step report before a hang restart")
    flag("exit-timeout", help="once a worker finished (exit 0), seconds its peers get to exit before they are "
         "stopped (a hung teardown must not keep the job alive)")
    flag("connect-timeout", help="seconds to reach the coordinator before giving up")
    flag("control", default="", help="control ROUTER address (tcp://... or ipc://...; default: a free loopback port)")
    flag("pub", default="", help="telemetry PUB address (default: a free loopback port)")
    flag("heartbeat", help="seconds between node heartbeats (lost after 3 misses)")
    flag("keys", default=os.environ.get("ELASTICD_KEYS") or Default(""),
         help="CURVE key store (see `elasticd keys`): encrypts and authenticates every socket")
    flag("port-range", default="", metavar="LOW-HIGH",
         help="ports for what the daemon opens to other nodes beyond --rdzv-endpoint/--control/--pub (with --keys: "
         "the store tunnel; with --rdzv-backend etcd: the mesh; in a job with relays: the relay), so a firewall can "
         "admit them (default: ephemeral)")
    flag("insecure", action="store_true", help="allow binding a non-loopback address without --keys (dangerous)")
    flag("no-zygote", action="store_true", help="exec a fresh interpreter per worker instead of forking "
         "from one that pre-imported torch (slower restarts)")
    flag("metrics-from-output", default="", metavar="REGEX",
         help="read step and loss from the workers' output lines, e.g. 'step=(?P<step>\\d+).*loss=(?P<loss>[\\d.]+)'")
    flag("preload", default=DEFAULT_PRELOAD,
         help="modules the zygote imports once for every worker (comma-separated; '' for none)")
    flag("metrics-port", default=None, metavar="PORT", help="serve Prometheus metrics on this port (0: a free one, "
         "printed at start) at the control socket's host; read-only and unauthenticated (docs/metrics.md)")
    add_alert_flags(flag)
    p.add_argument("script", metavar="SCRIPT", help="training script (or module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def add_alert_flags(flag: Callable[..., None]) -> None:
    """What the coordinator's daemon pages on (docs/metrics.md, "Alerts")."""
    flag("on-event", action="append", default=[], metavar="KINDS:ACTION",
         help="on the coordinator's daemon, for each job event of these kinds (comma-separated, * for all), run "
         "ACTION with sh (the event as JSON on stdin and in $ELASTICD_EVENT), or POST it to ACTION if it is an "
         "http(s) URL; repeatable, e.g. --on-event 'node_lost,job_end:./page.sh' (docs/metrics.md, Alerts)")
    flag("alert-goodput-below", default="0", metavar="SHARE",
         help="a goodput_low event (for --on-event) when goodput over --alert-goodput-window falls under SHARE, "
         "e.g. 0.9 (default 0: never)")
    flag("alert-goodput-window", default="3600", metavar="SECONDS",
         help="the window of --alert-goodput-below, at most 3600 (default 3600)")
    flag("alert-checkpoint-age", default="0", metavar="SECONDS",
         help="a checkpoint_stale event when the job's newest checkpoint is older than this (default 0: never)")
    flag("health-check", default="", metavar="CMD",
         help="the site's own node check, run by `sh -c` every --health-interval: a non-zero exit or a timeout "
              "cordons the node (its last output line is the reason; docs/health.md)")
    flag("health-interval", default="30", metavar="SECONDS", help="how often each node checks itself (default 30)")
    flag("health-timeout", default="10", metavar="SECONDS", help="a check running longer fails (default 10)")
    flag("lemon-failures", default="3", metavar="K",
         help="a node that is the root cause of K worker failures within --lemon-window is cordoned (0: never)")
    flag("lemon-window", default="600", metavar="SECONDS", help="the window of --lemon-failures (default 600)")


def config_from_args(ns: argparse.Namespace) -> tuple[JobConfig, float]:
    scheduler, notes = apply_slurm(ns)
    notes += torchrun_values(ns)
    conf, conf_notes = parse_rdzv_conf(ns.rdzv_conf)
    low, high = parse_nnodes(ns.nnodes)
    nproc = _nproc(ns.nproc_per_node)
    etcd = _etcd_backend(ns.rdzv_backend or "c10d", notes)
    host, port, job_id = _rendezvous(ns, low, high, etcd)
    timeouts = _timeouts(ns, conf)
    console, std_notes = console_ranks(nproc, ns.redirects, ns.tee, ns.local_ranks_filter)
    entry = _entry(ns, notes)
    if ns.max_restarts < 0:
        raise ConfigError("--max-restarts must be 0 or more")
    below, window, age = _alarms(ns)
    if conf.get("is_host") is True and not is_local_host(host):
        raise ConfigError(f"--rdzv-conf is_host=true, but {host} is not this host: the coordinator runs on "
                          "the rendezvous endpoint's host")
    cfg = JobConfig(
        min_nodes=low, max_nodes=high, nproc_per_node=nproc, rdzv_host=host, rdzv_port=port,
        job_id=check_job_id(job_id), node_id=check_node_id(ns.node_id or default_node_id()), entry=entry,
        max_restarts=ns.max_restarts, grace_s=timeouts["grace_period"],
        log_dir=os.path.abspath(ns.log_dir or "elastic-logs"), join_timeout_s=timeouts["join_timeout"],
        hang_timeout_s=timeouts["hang_timeout"], exit_timeout_s=timeouts["exit_timeout"],
        heartbeat_s=timeouts["heartbeat"], heartbeat_misses=int(conf.get("heartbeat_misses", 3)),
        local_addr=ns.local_addr or "", control_bind=ns.control, pub_bind=ns.pub,
        zygote=not (ns.no_zygote or ns.no_python), preload=ns.preload, keys_dir=ns.keys, insecure=ns.insecure,
        metrics_from_output=ns.metrics_from_output, role=ns.role, console_ranks=console, no_python=ns.no_python,
        line_prefix=line_prefix(ns.log_line_prefix_template or os.environ.get(PREFIX_ENV, "")),
        node_rank=max(ns.node_rank, -1), host_coordinator=conf.get("is_host") is not False,
        port_range=parse_port_range(ns.port_range),
        leave_signals=parse_signals(ns.signals_to_handle) if ns.signals_to_handle else DEFAULT_LEAVE_SIGNALS,
        metrics_port=parse_metrics_port(ns.metrics_port),
        etcd_endpoints=parse_endpoints(ns.rdzv_endpoint) if etcd else (),
        lease_ttl_s=int(conf.get("lease_ttl", 5)), etcd_outage_s=float(conf.get("etcd_outage_timeout", 300.0)),
        etcd_access=_etcd_access(conf, etcd),
        relay_group=int(conf.get("relay_group", 32)), relay_from=int(conf.get("relay_from", 256)),
        on_event=tuple(parse_alert(rule, EventKind) for rule in ns.on_event),
        alert_goodput_below=below, alert_goodput_window_s=window, alert_checkpoint_age_s=age,
        scheduler=scheduler, **_health(ns),
    )
    for note in notes + conf_notes + std_notes + _checked(cfg):
        print(f"elasticd start: {note}", file=sys.stderr, flush=True)
    return cfg, timeouts["connect_timeout"]


def _checked(cfg: JobConfig) -> list[str]:
    """The checks that need the whole config; what they have to say."""
    if cfg.metrics_from_output:
        compile_pattern(cfg.metrics_from_output)
    check_exposure(cfg)
    if cfg.port_range and not cfg.keys_dir and not cfg.etcd_endpoints and not cfg.relay_size:
        return ["--port-range is unused here: it places the store tunnel (--keys), the mesh (--rdzv-backend etcd) "
                "and the relay (a job with relays), and this job has none of them"]
    return []


PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"  # torchrun reads it where --log-line-prefix-template is not given
PREFIX_MACROS = {"role_name": "", "local_rank": 0, "rank": 0, "hostname": ""}


def line_prefix(template: str) -> str:
    """--log-line-prefix-template, checked: only torchrun's macros, and `$` only before one ("$$" is a dollar)."""
    try:
        string.Template(template).substitute(PREFIX_MACROS)
    except KeyError as err:
        raise ConfigError(f"--log-line-prefix-template: no macro ${{{err.args[0]}}}; it knows "
                          f"{', '.join('${' + m + '}' for m in PREFIX_MACROS)}") from None
    except ValueError:
        raise ConfigError(f"--log-line-prefix-template: a lone $ in {template!r} (write $$ for a dollar)") from None
    return template


def _nproc(text: str) -> int:
    nproc = str(_auto_nproc(text)) if text in ("auto", "cpu", "gpu", "xpu") else text
    if not nproc.isdigit() or int(nproc) < 1:
        raise ConfigError(f"--nproc-per-node must be a positive integer or auto, got {nproc!r}")
    return int(nproc)


def _etcd_backend(backend: str, notes: list[str]) -> bool:
    """etcd (and torchrun's etcd-v2) elects the coordinator on etcd; c10d and static mean the embedded one."""
    if backend in ("etcd", "etcd-v2"):
        return True
    if backend not in ("c10d", "static"):
        notes.append(f"--rdzv-backend {backend} has no effect: elasticd's coordinator is the rendezvous "
                     "(c10d, static), or etcd elects it (etcd)")
    return False


ETCD_KEYS = ("protocol", "cacert", "cert", "key", "user", "password_file", "password_env")


def _etcd_access(conf: dict[str, Setting], etcd: bool) -> EtcdAccess:
    """--rdzv-conf's TLS and login settings, consistent with each other; a certificate means https."""
    given = {k: str(conf[k]) for k in ETCD_KEYS if k in conf}
    if given and not etcd:
        raise ConfigError(f"--rdzv-conf {', '.join(given)}: only --rdzv-backend etcd talks to etcd")
    tls = [k for k in ("cacert", "cert", "key") if k in given]
    protocol = given.setdefault("protocol", "https" if tls else "http")
    if tls and protocol == "http":
        raise ConfigError(f"--rdzv-conf {tls[0]} needs protocol=https (or leave protocol out)")
    if ("cert" in given) != ("key" in given):
        raise ConfigError("--rdzv-conf cert and key go together: the client certificate and its private key")
    secrets = [k for k in ("password_file", "password_env") if k in given]
    if len(secrets) > 1 or (secrets and "user" not in given) or ("user" in given and not secrets):
        raise ConfigError("--rdzv-conf user= needs its password in exactly one of password_file=PATH or "
                          "password_env=VARIABLE")
    if "password_env" in given and not os.environ.get(given["password_env"]):
        raise ConfigError(f"--rdzv-conf password_env={given['password_env']}: that variable is not set")
    if "password_file" in given and not Path(given["password_file"]).read_text().strip():
        raise ConfigError(f"--rdzv-conf password_file={given['password_file']}: the file is empty")
    return EtcdAccess(**given)


def _rendezvous(ns: argparse.Namespace, low: int, high: int, etcd: bool = False) -> tuple[str, int, str]:
    """The coordinator's host and port (with etcd: the first etcd endpoint, the route to the job), and the job id."""
    if etcd:
        if ns.standalone:
            raise ConfigError("--standalone runs its own coordinator: drop it with --rdzv-backend etcd")
        host, port = parse_endpoints(ns.rdzv_endpoint or "")[0]
        return host, port, ns.rdzv_id or "default"
    if ns.standalone:
        if low != 1 or high != 1:
            raise ConfigError("--standalone is a single-node job: drop --nnodes or set it to 1")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return "127.0.0.1", s.getsockname()[1], ns.rdzv_id or uuid.uuid4().hex[:8]
    endpoint = ns.rdzv_endpoint
    if ns.master_port is not None and not 0 < ns.master_port < 65536:
        raise ConfigError(f"--master-port must be in 1..65535, got {ns.master_port}")
    if not endpoint and (ns.master_addr or ns.master_port):  # torchrun's static form: the master hosts the rendezvous
        endpoint = f"{ns.master_addr or '127.0.0.1'}:{ns.master_port or 29500}"
    if not endpoint:
        if high > 1:
            raise ConfigError("--rdzv-endpoint HOST:PORT is required for a multi-node job (or --master-addr and "
                              "--master-port, or --standalone)")
        endpoint = "127.0.0.1:29400"
    host, port = parse_endpoint(endpoint)
    return host, port, ns.rdzv_id or "default"


def _timeouts(ns: argparse.Namespace, conf: dict[str, Setting]) -> dict[str, float]:
    """Our flag when given, else the torchrun flag that sets the same thing, else our default."""
    if ns.shutdown_timeout is not None and ns.shutdown_timeout <= 0:
        raise ConfigError("--shutdown-timeout must be positive")
    torchrun = {**conf, "grace_period": ns.shutdown_timeout}
    values = {}
    for name, default in TIMEOUT_DEFAULTS.items():
        value = next((v for v in (getattr(ns, name), torchrun.get(name)) if v is not None), default)
        if value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive")
        values[name] = value
    return values


def _alarms(ns: argparse.Namespace) -> tuple[float, float, float]:
    """--alert-goodput-below, --alert-goodput-window, --alert-checkpoint-age, checked (nan fails every test)."""
    below, window, age = (_number(getattr(ns, f"alert_{name}")) for name in
                          ("goodput_below", "goodput_window", "checkpoint_age"))
    if not 0 <= below < 1:
        raise ConfigError(f"--alert-goodput-below must be a share in [0, 1), e.g. 0.9, got {ns.alert_goodput_below!r}")
    if not 0 < window <= WINDOW_S:
        raise ConfigError(f"--alert-goodput-window must be in (0, {WINDOW_S:g}] seconds, "
                          f"got {ns.alert_goodput_window!r}")
    if not 0 <= age < math.inf:
        raise ConfigError(f"--alert-checkpoint-age must be 0 (never) or a number of seconds, "
                          f"got {ns.alert_checkpoint_age!r}")
    return below, window, age


def _health(ns: argparse.Namespace) -> dict[str, Any]:
    """--health-check and its interval and timeout, --lemon-failures and --lemon-window, checked."""
    interval, timeout, window = (_number(getattr(ns, name)) for name in
                                 ("health_interval", "health_timeout", "lemon_window"))
    for name, value in (("health_interval", interval), ("health_timeout", timeout), ("lemon_window", window)):
        if not 0 < value < math.inf:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive number of seconds, "
                              f"got {getattr(ns, name)!r}")
    if not ns.lemon_failures.isdigit():
        raise ConfigError(f"--lemon-failures must be 0 (never) or a count, got {ns.lemon_failures!r}")
    return {"health_command": ns.health_check, "health_interval_s": interval, "health_timeout_s": timeout,
            "lemon_failures": int(ns.lemon_failures), "lemon_window_s": window}


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _entry(ns: argparse.Namespace, notes: list[str]) -> list[str]:
    """What follows the interpreter (or, with --no-python, the whole command)."""
    if ns.run_path and (ns.module or ns.no_python):
        raise ConfigError("--run-path runs a Python file by its path: drop -m and --no-python")
    if ns.no_python:
        if ns.module:
            raise ConfigError("--no-python and -m cannot go together: a module needs the interpreter")
        if not ns.no_zygote:
            notes.append("--no-python: workers are exec'd directly; the warm zygote cannot start them "
                         "(restarts are slower)")
        return [_executable(ns.script), *ns.script_args]
    if not ns.module and not Path(ns.script).is_file():
        raise ConfigError(f"training script {ns.script!r} does not exist")
    return (["-m", ns.script] if ns.module else [ns.script]) + list(ns.script_args)


def _executable(program: str) -> str:
    if os.sep not in program and not Path(program).is_file():
        found = shutil.which(program)
        if found is None:
            raise ConfigError(f"--no-python: {program!r} is neither a file here nor a program on PATH")
        return found
    if not Path(program).is_file():
        raise ConfigError(f"--no-python: {program!r} does not exist")
    if not os.access(program, os.X_OK):
        raise ConfigError(f"--no-python: {program!r} is not executable (chmod +x it, or drop --no-python)")
    return os.path.abspath(program)


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
    if kind in ("auto", "gpu", "xpu"):
        try:
            import torch  # only here: `auto` asks torch for the accelerator count, as torchrun does

            accelerator = torch.xpu if kind == "xpu" else torch.cuda
            if accelerator.is_available():
                return accelerator.device_count()
        except ImportError:
            pass
    return os.cpu_count() or 1
