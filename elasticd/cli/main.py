"""`elasticd` entry point: `start` runs a node daemon; every other verb talks to a running job."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Coroutine
from typing import Any

from elasticd import __version__
from elasticd.cli.keys import add_keys_parser, run_keys
from elasticd.cli.scheduler import remove_job_keys
from elasticd.cli.start import add_start_parser, config_from_args
from elasticd.client import Client, ClientError, Credentials, Endpoints, discover
from elasticd.commands.event_text import line
from elasticd.commands.registry import REGISTRY
from elasticd.commands.verb import Command
from elasticd.job import logsink
from elasticd.job.config import ConfigError
from elasticd.job.runtime import raise_open_file_limit
from elasticd.keys.auth import KeyStoreError
from elasticd.wire.names import EventKind
from elasticd.wire.protocol import ProtocolError
from elasticd.wire.verb_replies import Hello
from elasticd.wire.verb_requests import EventsRequest, VerbRequest


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elasticd", description="Supervise, see and steer elastic PyTorch jobs.")
    parser.add_argument("--version", action="version", version=f"elasticd {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    add_start_parser(sub, parser)
    add_keys_parser(sub)
    for command in REGISTRY.values():
        add_verb_parser(sub, command)
    return parser


def add_verb_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(command.name, help=command.summary, description=command.summary)
    p.add_argument("--connect", default="", help="control address of any daemon of the job (default: discover)")
    p.add_argument("--job", default="", help="job id, when several jobs run on this host")
    p.add_argument("--json", action="store_true", help="print the raw JSON reply")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")
    p.add_argument("--key", default=os.environ.get("ELASTICD_KEY", ""),
                   help="your CURVE key (.key_secret file) for a job started with --keys")
    p.add_argument("--server-key", default=os.environ.get("ELASTICD_SERVER_KEY", ""),
                   help="the job's node key (node.key file or z85 text; default: from the daemon's endpoint file)")
    for a in command.args:
        typed = {"type": a.type} if a.type is not None else {}
        if a.flags:
            p.add_argument(*a.flags, dest=a.name, action=a.action, default=a.default, help=a.help, **typed)
        else:
            p.add_argument(a.name, action=a.action, help=a.help, **typed, **({"nargs": "?"} if a.optional else {}))
    if command.steer:
        p.add_argument("--dry-run", action="store_true", help="say what would happen; change nothing")
        p.add_argument("--force", action="store_true", help="override an interlock")


def verb_request(ns: argparse.Namespace) -> VerbRequest:
    """The request of a parsed verb command line, checked as the daemon checks it (ProtocolError: bad_argument)."""
    command = REGISTRY[ns.verb]
    fields: dict[str, object] = {}
    for a in command.args:
        value = getattr(ns, a.name)
        if value is not None and not a.cli_only:
            fields[a.field or a.name] = a.to_request(value) if a.to_request else value
    if command.steer:
        fields.update(dry_run=ns.dry_run, force=ns.force)
    return command.decode(fields)


def run_verb(ns: argparse.Namespace) -> int:
    targets = discover(ns.job) if not ns.connect else []
    jobs = sorted({t.job_id for t in targets})
    if len(jobs) > 1:
        print(f"elasticd: several jobs run on this host ({', '.join(jobs)}); pick one with --job", file=sys.stderr)
        return 2
    control = ns.connect or (targets[0].control if targets else "")
    if not control:
        print("elasticd: no running daemon found on this host; pass --connect tcp://HOST:PORT", file=sys.stderr)
        return 2
    try:
        credentials = credentials_for(ns, targets)
    except KeyStoreError as err:
        print(f"elasticd {ns.verb}: {err}", file=sys.stderr)
        return 2
    op, command = ns.verb, REGISTRY[ns.verb]
    try:
        request = verb_request(ns)
    except ProtocolError as err:  # e.g. a number past what the protocol carries
        print(f"elasticd {op}: {err.reason} [bad_argument]", file=sys.stderr)
        return 2
    with Client(control, ns.timeout, credentials) as client:
        try:
            result = client.call(op, **request.encode())
            if not getattr(ns, "follow", False):  # `events --follow` goes on to stream what happens next
                print(json.dumps(result, indent=1) if ns.json else command.render(command.answer(result)))
                return 0
            if command.follow is not None:
                for text in command.follow(client.call, request, command.answer(result)):
                    print(text, flush=True)
                return 0
            return follow_events(client, request, result, ns.json)
        except ClientError as err:
            print(f"elasticd {op}: {err.reason} [{err.code}]", file=sys.stderr)
            return 1
        except ProtocolError as err:  # a reply this CLI cannot read (a daemon of another version)
            print(f"elasticd {op}: the daemon's reply: {err.reason} [bad_message] (--json prints it as it came)",
                  file=sys.stderr)
            return 1
        except (KeyboardInterrupt, BrokenPipeError):  # Ctrl+C on --follow, or `| head` closing the pipe
            return 0
    return 0


def follow_events(client: Client, request: VerbRequest, result: dict[str, Any], as_json: bool) -> int:
    """`events --follow`: the events so far, then each as it happens, until the job ends (or Ctrl+C)."""
    for past in result["events"]:
        print(json.dumps(past) if as_json else line(past), flush=True)
    if any(past.get("kind") == EventKind.job_end for past in result["events"]):
        return 0  # the job is over: nothing more will happen
    hello = Hello.decode(client.call("hello"), "hello")
    pub = hello.events_pub or hello.pub  # events are published by the coordinator's daemon
    kinds = request.kinds if isinstance(request, EventsRequest) else []
    for frame in client.subscribe(pub):
        if frame.type == "ev" and (not kinds or frame.kind in kinds):
            print(json.dumps(frame.body) if as_json else line(frame.body), flush=True)
        if frame.type == "ev" and frame.kind == EventKind.job_end:
            return 0
    return 0


def credentials_for(ns: argparse.Namespace, targets: list[Endpoints]) -> Credentials | None:
    if not ns.key:
        return None
    server = ns.server_key or (targets[0].server_key if targets else "")
    if not server:
        raise KeyStoreError("--key needs the job's server key: pass --server-key (the node.key file)")
    return Credentials.load(ns.key, server)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.verb is None:
        parser.print_help()
        return 2
    if ns.verb == "keys":
        return run_keys(ns)
    if ns.verb != "start":
        return run_verb(ns)
    # A round logs a line per node (its workers stopped, started): skip what our format never shows, as the
    # logging HOWTO's "Optimization" advises (caller lookup, thread and process names).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logsink.configure(sys.stderr)
    try:
        cfg, connect_timeout = config_from_args(ns)
    except ConfigError as err:
        print(f"elasticd start: {err}", file=sys.stderr)
        return 2
    from elasticd.daemon.daemon import Daemon
    from elasticd.job.config import StartError

    if raised := raise_open_file_limit():
        logging.getLogger("elasticd").info("open files: soft limit %d -> %d (workers keep %d)", *raised, raised[0])
    try:
        return run_profiled(Daemon(cfg, connect_timeout).run())
    except StartError as err:
        print(f"elasticd start: {err}", file=sys.stderr)
        return 2
    finally:
        if not cfg.etcd_endpoints:  # with etcd the job outlives this daemon, and newcomers need the keys
            remove_job_keys(cfg.scheduler)


def run_profiled(main: Coroutine[Any, Any, int]) -> int:
    """ELASTICD_PROFILE=FILE: cProfile the daemon's whole life into FILE (for scale benchmarks; off by default)."""
    path = os.environ.get("ELASTICD_PROFILE")
    if not path:
        return asyncio.run(main)
    import cProfile

    profile = cProfile.Profile()
    try:
        return int(profile.runcall(asyncio.run, main))
    finally:
        profile.dump_stats(path)


if __name__ == "__main__":
    sys.exit(main())
