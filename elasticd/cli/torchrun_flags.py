"""torchrun's whole command line for `elasticd start`: one table of its flags, their PET_* defaults, what each does."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elasticd.job.config import ConfigError

Value = str | int | float | bool | None  # a flag's, converted (None: not given)
Convert = Callable[[str], Value]


@dataclass(frozen=True)
class TorchrunFlag:
    """One torchrun flag: its spellings, its PET_* default, and what `elasticd start` does with it."""

    name: str  # torchrun's dash spelling; the underscore spelling is added when it differs
    default: Value = None  # None on a flag with `ignored`: tells "given" from "not given"
    short: str = ""  # -m, -r, -t
    switch: bool = False  # takes no value (torchrun's check_env action)
    convert: Convert = str  # applied to the text from the command line or PET_<NAME>
    pet: bool = True  # torchrun reads PET_<NAME> for it (all but --logs-specs and --numa-binding)
    choices: tuple[str, ...] = ()
    ignored: str = ""  # why it has no effect under elasticd: said once on stderr when it is given
    help: str = ""
    action: type[argparse.Action] | None = None  # acts while parsing, as torchrun's does (--print-completion)

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def env_var(self) -> str:
        return f"PET_{self.dest.upper()}"

    @property
    def spellings(self) -> list[str]:
        long = [f"--{self.name}"] + ([f"--{self.dest}"] if "-" in self.name else [])
        return ([self.short] if self.short else []) + long


def _flag_text(text: str) -> bool:
    """torchrun's check_env reading of PET_<NAME>: an integer, non-zero means set."""
    return bool(int(text))


class PrintCompletion(argparse.Action):
    """torchrun's --print-completion: a completion script for every verb and flag of elasticd (`root`), written by
    the optional shtab package as torchrun's is, then exit; no SCRIPT needed."""

    def __init__(self, *args: Any, root: argparse.ArgumentParser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.root = root

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        try:
            import shtab
        except ImportError:
            parser.exit(2, "elasticd start: --print-completion needs the optional shtab package (pip install shtab)\n")
        print(shtab.complete(self.root, shell=values))
        parser.exit(0)


_NO_LOG_SPLIT = "every worker's output already goes to its own log file under --log-dir"
TORCHRUN_FLAGS: tuple[TorchrunFlag, ...] = (
    TorchrunFlag("nnodes", "1", help="N or MIN:MAX nodes (default 1)"),
    TorchrunFlag("nproc-per-node", "1", help="workers on this node: N, auto, cpu, gpu or xpu (default 1)"),
    TorchrunFlag("rdzv-backend",
                 help="c10d or static: the embedded coordinator (default); etcd: the coordinator is elected on etcd "
                 "and any daemon takes over when it goes (etcd-v2 means etcd)"),
    TorchrunFlag("rdzv-endpoint", "", help="HOST:PORT of the coordinator (the first daemon on that host binds it); "
                 "with --rdzv-backend etcd: etcd's HOST:PORT[,HOST:PORT...]"),
    TorchrunFlag("rdzv-id", "", help="job id shared by every node of the job"),
    TorchrunFlag("rdzv-conf", "", help="KEY=VALUE,...: join_timeout, read_timeout, timeout, is_host, "
                 "keep_alive_interval, keep_alive_max_attempt (see docs/torchrun-compat.md)"),
    TorchrunFlag("standalone", False, switch=True, help="a single-node job on a free local port"),
    TorchrunFlag("max-restarts", 0, convert=int, help="failure restarts allowed before the job fails (default 0)"),
    TorchrunFlag("monitor-interval", convert=float,
                 ignored="the daemon hears of a worker's exit when it happens; it does not poll"),
    TorchrunFlag("start-method", choices=("spawn", "fork", "forkserver"),
                 ignored="workers are forked from a warm zygote or exec'd"),
    TorchrunFlag("event-log-handler", ignored="job events go to `elasticd events` and the telemetry stream"),
    TorchrunFlag("role", "default", help="ROLE_NAME in every worker's environment (default: default)"),
    TorchrunFlag("module", False, short="-m", switch=True, help="treat SCRIPT as a Python module, like python -m"),
    TorchrunFlag("no-python", False, switch=True, help="exec SCRIPT itself, no interpreter (and no zygote)"),
    TorchrunFlag("run-path", False, switch=True, help="run SCRIPT with runpy.run_path semantics (what elasticd "
                 "always does)"),
    TorchrunFlag("log-dir", "", help="worker logs, one file per worker per round (default elastic-logs)"),
    TorchrunFlag("redirects", "0", short="-r", help="local ranks whose output stays off the console: 3, or "
                 "LOCAL_RANK:STD,... (the log file is always written)"),
    TorchrunFlag("tee", "0", short="-t", help="local ranks shown on the console even if redirected (as -r)"),
    TorchrunFlag("local-ranks-filter", "", help="only these local ranks' output on the console: 0,1,..."),
    TorchrunFlag("log-line-prefix-template", "", help="each console line's prefix, with ${role_name}, "
                 "${local_rank}, ${rank}, ${hostname} (default '[NODE:RANK] '; or "
                 "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)"),
    TorchrunFlag("duplicate-stdout-filters", ignored=_NO_LOG_SPLIT),
    TorchrunFlag("duplicate-stderr-filters", ignored=_NO_LOG_SPLIT),
    TorchrunFlag("node-rank", -1, convert=int, help="this node's place in the rank map (default: join order)"),
    TorchrunFlag("master-addr", help="coordinator host when --rdzv-endpoint is not given (torchrun's static form)"),
    TorchrunFlag("master-port", convert=int, help="coordinator port with --master-addr (default 29500)"),
    TorchrunFlag("local-addr", "", help="address other nodes reach this node on (default: auto)"),
    TorchrunFlag("logs-specs", pet=False, ignored="elasticd lays out worker logs itself: one file per worker per "
                 "round under --log-dir"),
    TorchrunFlag("numa-binding", pet=False, choices=("node", "socket", "exclusive", "core-complex"),
                 ignored="elasticd does not pin workers to CPUs; bind inside the script (os.sched_setaffinity)"),
    TorchrunFlag("signals-to-handle", "", help="signals on which this node leaves the job (default "
                 "SIGTERM,SIGINT,SIGHUP)"),
    TorchrunFlag("shutdown-timeout", convert=float, help="seconds from SIGTERM to SIGKILL for workers "
                 "(--grace-period)"),
    TorchrunFlag("print-completion", pet=False, choices=("bash", "zsh", "tcsh"), action=PrintCompletion,
                 help="print a shell completion script for elasticd and exit (needs the optional shtab package)"),
    TorchrunFlag("virtual-local-rank", False, switch=True, ignored="LOCAL_RANK stays the worker's real local "
                 "rank and every GPU stays visible; pick the device with LOCAL_RANK"),
)


class Default(str):
    """A flag's value that nobody gave (neither the command line nor PET_*): a scheduler's may replace it."""


def add_torchrun_flags(p: argparse.ArgumentParser, root: argparse.ArgumentParser) -> None:
    """Every torchrun flag in every spelling; the default comes from PET_<NAME> as torchrun takes it. `root`: the
    whole command's parser (--print-completion completes it)."""
    for flag in TORCHRUN_FLAGS:
        # The env text is kept raw here and converted by torchrun_values: a bad PET_* value must be a
        # one-line ConfigError at `start`, not a crash while building the parser for every verb.
        default: Value = os.environ.get(flag.env_var) if flag.pet else None
        if default is None:
            default = Default(flag.default) if isinstance(flag.default, str) else flag.default
        text = flag.help or f"accepted; {flag.ignored}"
        if flag.switch:
            p.add_argument(*flag.spellings, dest=flag.dest, default=default, help=text, action="store_true")
        elif flag.action is not None:
            p.add_argument(*flag.spellings, dest=flag.dest, default=default, help=text, choices=flag.choices or None,
                           action=flag.action, root=root)  # argparse hands `root` to the action
        else:  # choices=None: any value
            p.add_argument(*flag.spellings, dest=flag.dest, default=default, help=text, choices=flag.choices or None)


def torchrun_values(ns: argparse.Namespace) -> list[str]:
    """Convert every torchrun flag's text in place; returns the lines for flags that have no effect here."""
    notes = []
    for flag in TORCHRUN_FLAGS:
        value = getattr(ns, flag.dest)
        if isinstance(value, str):
            convert = _flag_text if flag.switch else flag.convert
            try:
                value = convert(value)
            except ValueError:
                source = f"--{flag.name}" + (f" (or {flag.env_var})" if flag.pet else "")
                kind = "0 or 1" if flag.switch else "an integer" if convert is int else "a number"
                raise ConfigError(f"{source} must be {kind}, got {value!r}") from None
            if flag.choices and value not in flag.choices:
                raise ConfigError(f"{flag.env_var} must be one of {', '.join(flag.choices)}, got {value!r}")
            setattr(ns, flag.dest, value)
        if flag.ignored and value is not None and value is not False:
            shown = f"--{flag.name}" + ("" if flag.switch else f" {value}")
            notes.append(f"{shown} has no effect: {flag.ignored}")
    return notes
