"""`elastic-tui connect [ADDR ...] [--readonly] [--job JOB]`: find the daemons and run the console."""

from __future__ import annotations

import argparse
import os
import sys

from elasticd.client import Client, ClientError, Credentials, discover
from elasticd.keys.auth import KeyStoreError
from elasticd.wire.handshake import CODES as HANDSHAKE_CODES

DESCRIPTION = """\
elastic-tui: the live console of elasticd jobs (k9s-style keys; `?` inside lists them all).

  elastic-tui connect                     every job whose daemons run on this host (found via their endpoint files)
  elastic-tui connect tcp://HOST:PORT     one daemon's control address is enough: any daemon answers for its
                                          whole job, and the console subscribes to every member it learns of
  elastic-tui connect A B ...             several addresses; daemons of different jobs show as separate jobs
                                          (switch with `]` or `:job ID`)
  --job JOB                               only this job
  --readonly                              watch only: every steering action is disabled
  --key FILE [--server-key FILE]          your key for a job started with `elasticd start --keys`
"""


def credentials(key: str, server_key: str, job_filter: str) -> Credentials | None:
    """A --key for a job started with --keys; its server key defaults to the local daemons' endpoint files."""
    if not key:
        return None
    server = server_key or next((e.server_key for e in discover(job_filter) if e.server_key), "")
    if not server:
        raise KeyStoreError("--key needs the job's server key: pass --server-key (its node.key file)")
    return Credentials.load(key, server)


def resolve(addresses: list[str], job_filter: str,
            creds: Credentials | None = None) -> tuple[dict[str, list[str]], dict[str, str]]:
    """job id -> control addresses, and control -> PUB address, from discovery or each daemon's hello."""
    jobs: dict[str, list[str]] = {}
    pubs: dict[str, str] = {}
    if not addresses:
        for endpoint in discover(job_filter):
            jobs.setdefault(endpoint.job_id, []).append(endpoint.control)
            pubs[endpoint.control] = endpoint.pub
        return jobs, pubs
    for address in addresses:
        control = address if "://" in address else f"tcp://{address}"
        try:
            with Client(control, timeout_s=2.0, credentials=creds) as client:
                hello = client.call("hello")
            job_id, pubs[control] = str(hello.get("job_id", "?")), str(hello.get("pub", ""))
        except ClientError as err:
            said = err.reason if err.code in HANDSHAKE_CODES else f"{control} did not answer ({err.reason})"
            print(f"elastic-tui: {said}; showing it as missing, retrying", file=sys.stderr)
            job_id = job_filter or f"? {control}"
        if not job_filter or job_id == job_filter:
            jobs.setdefault(job_id, []).append(control)
    return jobs, pubs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="elastic-tui", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    connect = sub.add_parser("connect", help="watch and steer jobs", description=DESCRIPTION,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    connect.add_argument("addresses", nargs="*", metavar="ADDR", help="daemon control address(es), tcp://HOST:PORT")
    connect.add_argument("--readonly", action="store_true", help="disable every steering action")
    connect.add_argument("--job", default="", help="show only this job id")
    connect.add_argument("--key", default=os.environ.get("ELASTICD_KEY", ""),
                         help="your CURVE key (.key_secret) for a job started with --keys")
    connect.add_argument("--server-key", default=os.environ.get("ELASTICD_SERVER_KEY", ""),
                         help="the job's node key (node.key or z85); default: from local endpoint files")
    args = parser.parse_args(argv)
    try:
        creds = credentials(args.key, args.server_key, args.job)
    except KeyStoreError as err:
        print(f"elastic-tui: {err}", file=sys.stderr)
        return 2
    jobs, pubs = resolve(args.addresses, args.job, creds)
    if not jobs:
        where = f"job '{args.job}' " if args.job else ""
        print(f"elastic-tui: no {where}daemon found on this host; start one with `elasticd start`, "
              "or pass a daemon address: elastic-tui connect tcp://HOST:PORT", file=sys.stderr)
        return 2
    from tui.app import ElasticApp
    from tui.session import LiveConnector

    ElasticApp(jobs, readonly=args.readonly, connect=LiveConnector(creds), seed_pubs=pubs).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
