"""`elasticd` entry point: `start` runs a node daemon; every other verb talks to a running job."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

from elasticd import __version__
from elasticd.auth import KeyStoreError
from elasticd.client import Client, ClientError, Credentials, Endpoints, discover
from elasticd.config import ConfigError
from elasticd.keys_cli import add_keys_parser, run_keys
from elasticd.render import render
from elasticd.start_cli import add_start_parser, config_from_args

VERBS: dict[str, str] = {
    "status": "job state, round, nodes, restarts by cause",
    "ranks": "rank map of this round and earlier ones",
    "workers": "worker processes of every node",
    "events": "job events (--follow to stream them)",
    "metrics": "step, loss, throughput, checkpoint age per rank",
    "scale": "set the target node count: scale N",
    "drain": "graceful leave of a node: drain NODE",
    "cordon": "keep a node out of the next rounds: cordon NODE",
    "uncordon": "let a cordoned node back in: uncordon NODE",
    "checkpoint": "shim workers save at their next common step",
    "restart": "operator restart of every worker",
    "kill-worker": "failure drill: kill-worker NODE RANK",
    "stop": "graceful end of the job",
}
STEER = {"scale", "drain", "cordon", "uncordon", "checkpoint", "restart", "kill-worker", "stop"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elasticd", description="Supervise, see and steer elastic PyTorch jobs.")
    parser.add_argument("--version", action="version", version=f"elasticd {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    add_start_parser(sub)
    add_keys_parser(sub)
    for verb, summary in VERBS.items():
        p = sub.add_parser(verb, help=summary, description=summary)
        p.add_argument("--connect", default="", help="control address of any daemon of the job (default: discover)")
        p.add_argument("--job", default="", help="job id, when several jobs run on this host")
        p.add_argument("--json", action="store_true", help="print the raw JSON reply")
        p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")
        p.add_argument("--key", default=os.environ.get("ELASTICD_KEY", ""),
                       help="your CURVE key (.key_secret file) for a job started with --keys")
        p.add_argument("--server-key", default=os.environ.get("ELASTICD_SERVER_KEY", ""),
                       help="the job's node key (node.key file or z85 text; default: from the daemon's endpoint file)")
        if verb in ("scale",):
            p.add_argument("nodes", type=int, help="target number of nodes")
        if verb in ("drain", "cordon", "uncordon", "kill-worker"):
            p.add_argument("node", help="node id")
        if verb == "kill-worker":
            p.add_argument("rank", type=int, help="global rank on that node")
        if verb == "workers":
            p.add_argument("--node", dest="only_node", default="", help="only this node")
        if verb == "events":
            p.add_argument("--follow", "-f", action="store_true", help="stream events as they happen")
            p.add_argument("--kind", action="append", default=[], help="only these kinds (repeatable)")
            p.add_argument("--since", type=float, default=0.0, help="only events newer than this many seconds")
            p.add_argument("--limit", type=int, default=200, help="at most this many past events")
        if verb in STEER:
            p.add_argument("--dry-run", action="store_true", help="say what would happen; change nothing")
            p.add_argument("--force", action="store_true", help="override an interlock")
    return parser


def request_args(ns: argparse.Namespace) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for name in ("nodes", "node", "rank"):
        if getattr(ns, name, None) is not None:
            args[name] = getattr(ns, name)
    if getattr(ns, "only_node", ""):
        args["node"] = ns.only_node
    if ns.verb in STEER:
        args.update(dry_run=ns.dry_run, force=ns.force)
    if ns.verb == "events":
        import time

        args.update(kinds=ns.kind, limit=ns.limit, since_ts=time.time() - ns.since if ns.since else 0.0)
    return args


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
    op = ns.verb
    with Client(control, ns.timeout, credentials) as client:
        try:
            result = client.call(op, **request_args(ns))
            if not (op == "events" and ns.follow):
                print(json.dumps(result, indent=1) if ns.json else render(op, result))
                return 0
            for event in result["events"]:
                print(json.dumps(event) if ns.json else render("event", event), flush=True)
            pub = (ns.connect and client.call("hello")["pub"]) or targets[0].pub
            for event in client.subscribe(pub):
                if event.type == "ev" and (not ns.kind or event.kind in ns.kind):
                    print(json.dumps(event.body) if ns.json else render("event", event.body), flush=True)
        except ClientError as err:
            print(f"elasticd {op}: {err.reason} [{err.code}]", file=sys.stderr)
            return 1
        except (KeyboardInterrupt, BrokenPipeError):  # Ctrl+C on --follow, or `| head` closing the pipe
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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s elasticd %(message)s", stream=sys.stderr)
    try:
        cfg, connect_timeout = config_from_args(ns)
    except ConfigError as err:
        print(f"elasticd start: {err}", file=sys.stderr)
        return 2
    from elasticd.config import StartError
    from elasticd.daemon import Daemon

    try:
        return asyncio.run(Daemon(cfg, connect_timeout).run())
    except StartError as err:
        print(f"elasticd start: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
