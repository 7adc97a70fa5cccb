"""The value syntaxes of torchrun's flags (--rdzv-conf, --redirects/--tee, --local-ranks-filter, signals), checked."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable

from elasticd.job.config import ConfigError

_TRUE, _FALSE = ("1", "true", "t", "yes", "y"), ("0", "false", "f", "no", "n")  # torch's RendezvousParameters
Setting = int | float | bool | str  # a --rdzv-conf value, converted


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError(text)
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _natural(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _bool(text: str) -> bool:
    if text.lower() not in (*_TRUE, *_FALSE):
        raise ValueError(text)
    return text.lower() in _TRUE


def _file(text: str) -> str:
    """A file every daemon reads (a certificate, a key, a password): it must be there and readable now."""
    path = os.path.abspath(os.path.expanduser(text))
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise ConfigError(f"{text}: {'cannot read it' if os.path.isfile(path) else 'no such file'}")
    return path


def _protocol(text: str) -> str:
    if text not in ("http", "https"):
        raise ConfigError(f"protocol must be http or https, got {text!r}")
    return text


def _password(_text: str) -> str:
    raise ConfigError("a password is never taken on the command line, where `ps` shows it to everyone on the host: "
                      "give password_file=PATH or password_env=VARIABLE")


# rdzv-conf key -> (our setting, its conversion); a setting of None: accepted, and the text says why it does nothing.
_RDZV_CONF: dict[str, tuple[str | None, Callable[[str], Setting] | str]] = {
    "join_timeout": ("join_timeout", _positive),
    "read_timeout": ("connect_timeout", _positive),
    "timeout": ("connect_timeout", _positive),
    "keep_alive_interval": ("heartbeat", _positive),
    "keep_alive_max_attempt": ("heartbeat_misses", _count),
    "is_host": ("is_host", _bool),
    "lease_ttl": ("lease_ttl", _count),  # --rdzv-backend etcd: the coordinator's lease, seconds
    "etcd_outage_timeout": ("etcd_outage_timeout", _positive),  # ... how long the job runs without etcd
    "protocol": ("protocol", _protocol),  # --rdzv-backend etcd over TLS: torchrun's etcd rendezvous' names
    "cacert": ("cacert", _file),
    "cert": ("cert", _file),
    "key": ("key", _file),
    "user": ("user", str),  # ... etcd's own authentication: the user, and where its password is
    "password_file": ("password_file", _file),
    "password_env": ("password_env", str),
    "password": ("password", _password),
    "relay_group": ("relay_group", _natural),  # members per relay; 0: none (docs/architecture.md "Relays")
    "relay_from": ("relay_from", _count),  # relays only in jobs whose --nnodes max is at least this
    "last_call_timeout": (None, "the coordinator forms a round after its own short settle window"),
    "close_timeout": (None, "a round closes when the coordinator starts it"),
    "store_type": (None, "workers use torch's own store at MASTER_ADDR:MASTER_PORT"),
}


def parse_rdzv_conf(text: str) -> tuple[dict[str, Setting], list[str]]:
    """torchrun's KEY=VALUE,... into our settings, plus a line for each key that has no effect here."""
    settings: dict[str, Setting] = {}
    notes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (s.strip() for s in part.partition("="))
        if key not in _RDZV_CONF:
            raise ConfigError(f"--rdzv-conf: unknown key {key!r}; known: {', '.join(_RDZV_CONF)}")
        if not sep or not value:
            raise ConfigError(f"--rdzv-conf: {key} needs a value ({key}=VALUE)")
        setting, handling = _RDZV_CONF[key]
        if setting is None:
            notes.append(f"--rdzv-conf {key} has no effect: {handling}")
            continue
        assert callable(handling)
        try:
            settings[setting] = handling(value)
        except ConfigError as err:
            raise ConfigError(f"--rdzv-conf {key}: {err}") from None
        except ValueError:
            kinds: dict[Callable[[str], Setting], str] = {_bool: "true or false", _natural: "0 or more"}
            kind = kinds.get(handling, "a positive number")
            raise ConfigError(f"--rdzv-conf: {key} must be {kind}, got {value!r}") from None
    return settings, notes


_STD = re.compile(r"[0-3]")


def parse_std(text: str, flag: str) -> tuple[int, dict[int, int]]:
    """torchrun's Std syntax: one value 0..3 for every local rank, or LOCAL_RANK:VALUE,... (others 0)."""
    text = text.strip()
    if _STD.fullmatch(text):
        return int(text), {}
    per_rank: dict[int, int] = {}
    for part in text.split(","):
        rank, sep, value = (s.strip() for s in part.partition(":"))
        if not (sep and rank.isdigit() and _STD.fullmatch(value)):
            raise ConfigError(f"--{flag} must be 0..3 or LOCAL_RANK:0..3,... (0 none, 1 stdout, 2 stderr, "
                              f"3 both), got {text!r}")
        per_rank[int(rank)] = int(value)
    return 0, per_rank


def parse_local_ranks(text: str) -> set[int] | None:
    """--local-ranks-filter 0,2 -> {0, 2}; empty: every rank."""
    if not text.strip():
        return None
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise ConfigError(f"--local-ranks-filter must be local ranks like 0,1,2, got {text!r}")
    return {int(p) for p in parts}


def console_ranks(nproc: int, redirects: str, tee: str, shown: str) -> tuple[frozenset[int] | None, list[str]]:
    """The local ranks whose output reaches the console (None: all), and a line when a stream split cannot be kept."""
    (redirect_all, redirect), (tee_all, teed) = parse_std(redirects, "redirects"), parse_std(tee, "tee")
    wanted = parse_local_ranks(shown)
    ranks, notes = set(), []
    for rank in range(nproc):
        hidden = redirect.get(rank, redirect_all) & ~teed.get(rank, tee_all)
        if hidden in (1, 2):
            notes.append(f"--redirects {redirects}: local rank {rank}'s stdout and stderr share one pipe, "
                         "so its whole output stays off the console (it is in its log file)")
        if not hidden and (wanted is None or rank in wanted):
            ranks.add(rank)
    return (None if len(ranks) == nproc else frozenset(ranks)), notes[:1]


def parse_signals(text: str) -> tuple[str, ...]:
    """SIGTERM,SIGUSR1 (or TERM,USR1) -> signal names; SIGKILL and SIGSTOP cannot be handled."""
    names = tuple(n if n.startswith("SIG") else f"SIG{n}" for n in (p.strip().upper() for p in text.split(",")) if n)
    bad = [n for n in names if n not in signal.Signals.__members__ or n in ("SIGKILL", "SIGSTOP")]
    if not names or bad:
        raise ConfigError(f"--signals-to-handle must be catchable signal names like SIGTERM,SIGUSR1, got {text!r}")
    return names
