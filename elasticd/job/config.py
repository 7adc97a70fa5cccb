"""Parsed `elasticd start` settings, validated into one immutable JobConfig."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

from elasticd.wire.protocol import JsonObject

DEFAULT_LEAVE_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")  # the signals on which a node leaves the job
# What the zygote imports once for every worker (docs/architecture.md, "Fast worker starts"): torch, DDP's dynamo,
# and what an in-place sharded worker imports at its start (FSDP2, DTensor, DCP's state dicts, the shim), which a
# crash's replacement would otherwise import while its peers wait for it.
DEFAULT_PRELOAD = ",".join(("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo",
                            "torch.distributed.fsdp", "torch.distributed.tensor",
                            "torch.distributed.checkpoint.state_dict", "trainer_shim.elastic"))
STOP_SLACK_S = 5.0  # beyond the grace period, how long a new round waits for a node to stop its old workers
# In place, the node first waits this long beyond the grace period for its kept workers to leave their group (a
# survivor blocked in a collective errors at its group's timeout), so an in-place round's stop barrier waits as long.
LEAVE_SLACK_S = 10.0


def stop_barrier_s(grace_s: float, in_place: bool) -> float:
    """How long a round's stop barrier waits for every node's old workers (the coordinator's side); a node waits
    for `go` one STOP_SLACK_S longer, so the barrier always gives up first."""
    return grace_s + STOP_SLACK_S + (LEAVE_SLACK_S if in_place else 0.0)


@dataclass(frozen=True)
class AlertRule:
    """`--on-event KINDS:ACTION`: on an event of one of `kinds` (empty: any), run `action` (a shell command) or,
    for an http(s) URL, POST the event to it (daemon/alerts.py)."""

    kinds: frozenset[str]
    action: str

    @property
    def webhook(self) -> bool:
        return self.action.startswith(("http://", "https://"))


@dataclass(frozen=True)
class EtcdAccess:
    """How every request reaches etcd (--rdzv-conf): TLS with torchrun's names, and etcd's own user. The password
    is never held here, nor taken from the command line: it is read from `password_file` or `password_env`."""

    protocol: str = "http"
    cacert: str = ""  # the CA that signs etcd's certificate: it wins over REQUESTS_CA_BUNDLE and the system's
    cert: str = ""  # our client certificate and its key (etcd's --client-cert-auth)
    key: str = ""
    user: str = ""  # etcd's authentication (RBAC): log in as this user
    password_file: str = ""
    password_env: str = ""

    def describe(self) -> str:
        """One line for `status` and the start-up log: how we reach etcd, without any secret."""
        parts = [self.protocol] + (["client certificate"] if self.cert else []) + \
            ([f"user {self.user}"] if self.user else [])
        return ", ".join(parts)


class ConfigError(ValueError):
    """A flag value that cannot work; the message is shown to the user as is."""


class StartError(Exception):
    """The daemon cannot start (a port in use, an endpoint it cannot bind); one line says why."""


@dataclass(frozen=True)
class JobConfig:
    """Everything `elasticd start` was told, checked once; every part reads it, none changes it."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    rdzv_host: str
    rdzv_port: int
    job_id: str
    node_id: str
    entry: list[str]  # the command after the interpreter: [script, args...] or ["-m", module, args...]
    max_restarts: int = 0
    grace_s: float = 5.0
    log_dir: str = "elastic-logs"
    join_timeout_s: float = 600.0
    hang_timeout_s: float = 60.0
    exit_timeout_s: float = 300.0  # torchrun's exit barrier: peers of a worker that finished get this long
    heartbeat_s: float = 1.0
    heartbeat_misses: int = 3
    local_addr: str = ""
    control_bind: str = ""
    pub_bind: str = ""
    omp_threads: int = 1
    python: str = ""
    keys_dir: str = ""  # CURVE key store (elasticd/keys/auth.py); empty: no encryption, loopback only
    insecure: bool = False  # allow non-loopback binds without keys
    zygote: bool = True  # fork workers from a pre-imported interpreter (elasticd/member/processes/zygote.py)
    preload: str = DEFAULT_PRELOAD
    env: dict[str, str] = field(default_factory=dict)
    role: str = "default"  # ROLE_NAME (torchrun's --role)
    metrics_from_output: str = ""  # REGEX with (?P<step>) / (?P<loss>) groups, matched on every worker line
    console_ranks: frozenset[int] | None = None  # local ranks whose output is echoed; None: all (log files: all)
    line_prefix: str = ""  # each echoed line's prefix, a template of ${role_name} ${local_rank} ${rank} ${hostname}
    no_python: bool = False  # exec the entry itself, no interpreter in front (torchrun's --no-python)
    node_rank: int = -1  # this node's place in the rank map (torchrun's --node-rank); -1: join order
    leave_signals: tuple[str, ...] = DEFAULT_LEAVE_SIGNALS  # torchrun's --signals-to-handle
    port_range: tuple[int, int] | None = None  # --port-range: where non-loopback ports we open go (the tunnel)
    host_coordinator: bool = True  # --rdzv-conf is_host=false: only ever a member, even on the endpoint's host
    metrics_port: int | None = None  # --metrics-port: serve Prometheus metrics there (0: a free port); None: off
    # --rdzv-backend etcd: the coordinator is elected on this etcd cluster (daemon/failover.py); empty: embedded
    etcd_endpoints: tuple[tuple[str, int], ...] = ()
    lease_ttl_s: int = 5  # --rdzv-conf lease_ttl: a dead coordinator is replaced within about this long
    etcd_outage_s: float = 300.0  # --rdzv-conf etcd_outage_timeout: how long the job runs without etcd, then stops
    etcd_access: EtcdAccess = EtcdAccess()  # --rdzv-conf protocol, cacert, cert, key, user, password_file/_env
    relay_group: int = 32  # --rdzv-conf relay_group: members per relay (0: no relays); docs/architecture.md "Relays"
    relay_from: int = 256  # --rdzv-conf relay_from: a job whose --nnodes max is below this has no relays
    on_event: tuple[AlertRule, ...] = ()  # --on-event: what the coordinator's daemon runs or posts on which events
    alert_goodput_below: float = 0.0  # --alert-goodput-below: `goodput_low` under this share (0: never)
    alert_goodput_window_s: float = 3600.0  # --alert-goodput-window: over this many seconds
    alert_checkpoint_age_s: float = 0.0  # --alert-checkpoint-age: `checkpoint_stale` past this age (0: never)
    scheduler: JsonObject = field(default_factory=dict)  # the SLURM step it runs in (job/slurm.py), for status
    health_command: str = ""  # --health-check CMD: the site's own check, run by `sh -c` (docs/health.md)
    health_interval_s: float = 30.0  # --health-interval: how often each node checks itself
    health_timeout_s: float = 10.0  # --health-timeout: a check running longer fails
    lemon_failures: int = 3  # --lemon-failures: root-cause failures that make a node a lemon (0: never)
    lemon_window_s: float = 600.0  # --lemon-window: ... within this many seconds

    @property
    def lost_after_s(self) -> float:
        return self.heartbeat_s * self.heartbeat_misses

    @property
    def relay_size(self) -> int:
        """Members per relay in this job; 0 when it has none (a small job gains nothing from the extra hop)."""
        return self.relay_group if self.max_nodes >= self.relay_from else 0


def parse_nnodes(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if not match:
        raise ConfigError(f"--nnodes must be N or MIN:MAX with positive integers, got {text!r}")
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) else low
    if low < 1 or high < low:
        raise ConfigError(f"--nnodes {text!r}: need 1 <= MIN <= MAX")
    return low, high


def parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, "29400"
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--rdzv-endpoint must be HOST:PORT with a port in 1..65535, got {text!r}")
    return host, int(port)


def parse_endpoints(text: str) -> tuple[tuple[str, int], ...]:
    """`HOST:PORT[,HOST:PORT...]`: etcd's client endpoints (port 2379 when left out)."""
    endpoints = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if part.startswith("https://"):
            raise ConfigError(f"--rdzv-endpoint {part}: TLS to etcd is not supported yet; use http:// on a trusted "
                              "network")
        host, sep, port = part.removeprefix("http://").rpartition(":")
        if not sep:
            host, port = part, "2379"
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--rdzv-endpoint for etcd must be HOST:PORT[,HOST:PORT...], got {text!r}")
        endpoints.append((host.strip("[]"), int(port)))
    if not endpoints:
        raise ConfigError("--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT[,HOST:PORT...] (etcd's client URLs)")
    return tuple(endpoints)


def parse_port_range(text: str) -> tuple[int, int] | None:
    """`LOW-HIGH`, both in 1..65535; empty: ephemeral ports."""
    if not text:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if not match or not 0 < int(match.group(1)) <= int(match.group(2)) < 65536:
        raise ConfigError(f"--port-range must be LOW-HIGH with 1 <= LOW <= HIGH <= 65535, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def default_node_id() -> str:
    """The full hostname: `gpu-017.us-east-1` and `gpu-017.us-west-2` are different nodes."""
    return socket.gethostname() or "node"


_LABEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}")  # a DNS label ('_' too, as --node-id always allowed)
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")


def check_node_id(node_id: str) -> str:
    """Any hostname: dot-separated labels of letters, digits, '-' (and '_'), 253 characters at most."""
    if len(node_id) > 253 or not all(_LABEL.fullmatch(label) for label in node_id.split(".")):
        raise ConfigError(f"--node-id {node_id!r}: use a hostname (labels of 1-63 letters, digits, '-' or '_', "
                          "separated by '.', 253 characters at most)")
    return node_id


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.fullmatch(job_id):
        raise ConfigError(f"--rdzv-id {job_id!r}: use 1-63 letters, digits, '_' or '-'")
    return job_id


def parse_alert(text: str, kinds: Iterable[str]) -> AlertRule:
    """`KIND[,KIND...]:COMMAND` or `KIND[,KIND...]:URL`; `*` for every kind."""
    names, sep, action = text.partition(":")
    wanted = frozenset(k.strip() for k in names.split(",") if k.strip())
    if not sep or not action.strip() or not wanted:
        raise ConfigError(f"--on-event must be KIND[,KIND...]:COMMAND (or :URL), e.g. "
                          f"'node_lost,job_end:notify.sh', got {text!r}")
    unknown = sorted(wanted - {*kinds, "*"})
    if unknown:
        raise ConfigError(f"--on-event: no event kind {', '.join(unknown)}; kinds: {', '.join(sorted(kinds))}, "
                          "or * for all")
    return AlertRule(frozenset() if "*" in wanted else wanted, action.strip())


def parse_metrics_port(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isdigit() or int(text) > 65535:
        raise ConfigError(f"--metrics-port must be a port in 0..65535 (0: a free one), got {text!r}")
    return int(text)
