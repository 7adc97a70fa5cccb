"""`elasticd keys`: create, list, authorize and revoke CURVE keys for a job's daemons and its operators."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from elasticd.keys.auth import ROLES, KeyStore, KeyStoreError, default_dir


def add_keys_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="manage CURVE keys: init, create, authorize, revoke, list",
                       description="Keys for an authenticated job: every daemon gets --keys DIR; operators and "
                       "viewers get a key file for --key.")
    p.add_argument("--dir", default=str(default_dir()), help="key store folder (default: %(default)s)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    init = actions.add_parser("init", help="create the job's node key pair (copy DIR to every node)")
    init.add_argument("--force", action="store_true", help="replace an existing node key")
    create = actions.add_parser("create", help="create and authorize a client key pair")
    create.add_argument("name")
    create.add_argument("--role", choices=ROLES, default="viewer")
    authorize = actions.add_parser("authorize", help="authorize someone's public key file")
    authorize.add_argument("public_file")
    authorize.add_argument("--name", required=True)
    authorize.add_argument("--role", choices=ROLES, default="viewer")
    revoke = actions.add_parser("revoke", help="revoke an authorized key (running daemons refuse it at once)")
    revoke.add_argument("name")
    actions.add_parser("list", help="authorized keys with their roles")


def run_keys(ns: argparse.Namespace) -> int:
    store = KeyStore(Path(ns.dir))
    try:
        if ns.action == "init":
            secret = store.init(ns.force)
            print(f"node key: {secret}; start every daemon of the job with --keys {store.root}")
        elif ns.action == "create":
            secret = store.create_client(ns.name, ns.role)
            print(f"{ns.role} key for {ns.name}: {secret} (give this file to them: elasticd ... --key FILE)")
        elif ns.action == "authorize":
            print(f"authorized {ns.name} as {ns.role}: {store.authorize(Path(ns.public_file), ns.name, ns.role)}")
        elif ns.action == "revoke":
            store.revoke(ns.name)
            print(f"revoked {ns.name}")
        else:
            for key in store.authorized():
                print(f"{key.name:<20} {key.role:<9} {key.public.decode()}")
    except KeyStoreError as err:
        print(f"elasticd keys {ns.action}: {err}", file=sys.stderr)
        return 2
    return 0
