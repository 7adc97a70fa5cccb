"""CURVE keys and roles: the key store layout, socket set-up, and the ZAP authenticator with live revocation.

Layout of a key store (default ~/.config/elasticd/keys, or $ELASTICD_KEYS):
  node/node.key, node/node.key_secret   the job's daemon key pair; copy this folder to every node
  authorized/NAME.key                   public client keys allowed on control/PUB, with a `role` metadata
  clients/NAME.key, NAME.key_secret     key pairs made here by `elasticd keys create`; hand out the secret
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator

from elasticd.keys.peer_watch import PeerWatch, Refused, watch_of
from elasticd.keys.refusals import RefusalLog, fingerprint
from elasticd.wire.names import EventKind
from elasticd.wire.protocol import JsonObject

log = logging.getLogger("elasticd")
Report = Callable[..., None]  # the daemon's node_event(kind, **fields)
ROLES = ("viewer", "operator")
KEY_STAGE = "key"  # a refusal by the authenticator; the earlier stages are peer_watch.py's
NO_KEY = "-"
_ROLE = re.compile(r'^\s*role\s*=\s*"([^"]*)"', re.MULTILINE)


class KeyStoreError(Exception):
    """A key store or key file problem; the message is shown to the user as is."""


def default_dir() -> Path:
    return Path(os.environ.get("ELASTICD_KEYS") or Path.home() / ".config" / "elasticd" / "keys")


@dataclass(frozen=True)
class NodeKeys:
    """A daemon's CURVE key pair."""

    public: bytes
    secret: bytes


@dataclass(frozen=True)
class Authorized:
    """A client key allowed in, by name and role."""

    name: str
    role: str
    public: bytes


class KeyStore:
    """A job's keys on disk: the node pair, the authorized client keys, and the clients' own pairs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.node_dir, self.authorized_dir, self.clients_dir = root / "node", root / "authorized", root / "clients"

    def init(self, force: bool = False) -> Path:
        if (self.node_dir / "node.key_secret").exists() and not force:
            raise KeyStoreError(f"{self.node_dir} already holds a node key; --force replaces it (every node then "
                            "needs the new one)")
        for folder in (self.root, self.node_dir, self.authorized_dir, self.clients_dir):
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, 0o700)
        _, secret = zmq.auth.create_certificates(str(self.node_dir), "node")
        return Path(secret)

    def node_keys(self) -> NodeKeys:
        path = self.node_dir / "node.key_secret"
        if not path.exists():
            raise KeyStoreError(f"no node key in {self.node_dir}; run `elasticd keys init --dir {self.root}` and copy "
                            "the folder to every node")
        public, secret = zmq.auth.load_certificate(str(path))
        assert secret is not None
        return NodeKeys(public, secret)

    def create_client(self, name: str, role: str) -> Path:
        check_name_role(name, role)
        self.clients_dir.mkdir(parents=True, exist_ok=True)
        public_file, secret_file = zmq.auth.create_certificates(str(self.clients_dir), name, {"role": role})
        self.authorize(Path(public_file), name, role)
        return Path(secret_file)

    def authorize(self, public_file: Path, name: str, role: str) -> Path:
        check_name_role(name, role)
        try:
            public, _ = zmq.auth.load_certificate(str(public_file))
        except (OSError, ValueError) as exc:
            raise KeyStoreError(f"cannot read a public key from {public_file}: {exc}") from None
        self.authorized_dir.mkdir(parents=True, exist_ok=True)
        target = self.authorized_dir / f"{name}.key"
        text = (f'metadata\n    role = "{role}"\ncurve\n    public-key = "{public.decode()}"\n')
        target.write_text(text)
        return target

    def revoke(self, name: str) -> None:
        target = self.authorized_dir / f"{name}.key"
        if not target.exists():
            raise KeyStoreError(f"no authorized key named {name!r} in {self.authorized_dir}")
        target.unlink()

    def authorized(self) -> list[Authorized]:
        found = []
        for path in sorted(self.authorized_dir.glob("*.key")):
            try:
                public, _ = zmq.auth.load_certificate(str(path))
            except (OSError, ValueError):
                continue
            match = _ROLE.search(path.read_text())
            role = match.group(1) if match and match.group(1) in ROLES else "viewer"
            found.append(Authorized(path.stem, role, public))
        return found


def check_name_role(name: str, role: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,63}", name):
        raise KeyStoreError(f"key name {name!r}: use 1-63 letters, digits, '_' or '-'")
    if role not in ROLES:
        raise KeyStoreError(f"role {role!r}: use one of {', '.join(ROLES)}")


def serve_curve(sock: zmq.Socket, secret: bytes, public: bytes, domain: str) -> None:
    """Make `sock` a CURVE server whose clients the authenticator checks in `domain` (before bind); with a
    Gatekeeper started in its context, every connection it refuses is recorded, at whatever stage."""
    sock.curve_secretkey, sock.curve_publickey, sock.curve_server = secret, public, True
    sock.zap_domain = domain.encode()
    watch = watch_of(sock)
    if watch is not None:
        watch.add(sock, domain)


def connect_curve(sock: zmq.Socket, secret: bytes, public: bytes, server_public: bytes) -> None:
    """Make `sock` a CURVE client of a server with `server_public` (before connect)."""
    sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = secret, public, server_public


def load_client_key(secret_file: str) -> tuple[bytes, bytes]:
    try:
        public, secret = zmq.auth.load_certificate(secret_file)
    except (OSError, ValueError) as exc:
        raise KeyStoreError(f"cannot read key file {secret_file}: {exc}") from None
    if secret is None:
        raise KeyStoreError(f"{secret_file} holds no secret key; pass the .key_secret file")
    return public, secret


def load_public(value: str) -> bytes:
    """A server key given as a certificate file or as its 40-character z85 text."""
    if len(value) == 40 and not os.path.exists(value):
        return value.encode()
    try:
        public, _ = zmq.auth.load_certificate(value)
    except (OSError, ValueError) as exc:
        raise KeyStoreError(f"cannot read server key {value}: {exc}") from None
    return public


class _Authenticator(AsyncioAuthenticator):
    """pyzmq's ZAP handler, telling `on_refused` of each request it denies."""

    def __init__(self, ctx: zmq.asyncio.Context, on_refused: Callable[[list[bytes], bytes], None]) -> None:
        super().__init__(ctx)
        self.on_refused = on_refused
        self._request: list[bytes] = []

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        self._request = msg  # pyzmq awaits one request at a time, so any reply sent now answers this one
        try:
            await super().handle_zap_message(msg)
        finally:
            self._request = []

    def _send_zap_reply(self, request_id: bytes, status_code: bytes, status_text: bytes,
                        user_id: str = "anonymous") -> None:
        super()._send_zap_reply(request_id, status_code, status_text, user_id)
        if status_code == b"200":
            return
        try:
            self.on_refused(self._request, status_text)
        except Exception:  # the ZAP loop must outlive a bug here: without it no handshake ever completes
            log.exception("recording a refused key failed")


class Gatekeeper:
    """The ZAP authenticator plus the role table, reloaded whenever the authorized folder changes.

    Each refused connection is counted in `refusals`, whatever refused it: the authenticator (a key it does not
    know) or, before it is asked, the handshake itself (no key, a wrong server key, not ZeroMQ at all: PeerWatch).
    A rate-limited share becomes a log line and a `key_refused` event through `report`.
    """

    def __init__(self, ctx: zmq.asyncio.Context, store: KeyStore, report: Report | None = None) -> None:
        self.ctx = ctx
        self.store = store
        self.report = report
        self.refusals = RefusalLog()
        self.auth = _Authenticator(ctx, self.refused)
        self.watch: PeerWatch | None = None
        self.roles: dict[bytes, Authorized] = {}
        self._stamp = -1.0

    def start(self) -> None:
        """In the daemon's running loop, before any CURVE server of `ctx` is made."""
        self.auth.start()
        self.auth.configure_curve(domain="mesh", location=str(self.store.node_dir))
        self.reload()
        loop = asyncio.get_running_loop()
        self.watch = PeerWatch(self.ctx, lambda batch: loop.call_soon_threadsafe(self.refused_connections, batch))
        self.watch.start()

    def reload(self) -> None:
        """Pick up `elasticd keys create/authorize/revoke` done while the daemon runs."""
        try:
            stamp = self.store.authorized_dir.stat().st_mtime
        except OSError:
            stamp = 0.0
        if stamp == self._stamp:
            return
        self._stamp = stamp
        self.auth.configure_curve(domain="control", location=str(self.store.authorized_dir))
        self.roles = {a.public: a for a in self.store.authorized()}

    def refused(self, request: list[bytes], reason: bytes) -> None:
        """One denied ZAP request: [version, id, domain, address, identity, mechanism, credentials...]."""
        domain, address, mechanism = (_text(request, i) for i in (2, 3, 5))
        key = fingerprint(request[6]) if mechanism == "CURVE" and len(request) > 6 else NO_KEY
        self.record(Refused(domain, address, KEY_STAGE, reason.decode(errors="replace")), key)

    def refused_connections(self, batch: list[Refused]) -> None:
        """Connections refused before the authenticator was asked, from the watch thread (in the daemon's loop)."""
        for refused in batch:
            self.record(refused, NO_KEY)

    def record(self, refused: Refused, key: str) -> None:
        suppressed = self.refusals.record(refused.domain, refused.peer, key, time.time())
        if suppressed is None:
            return
        fields: JsonObject = {**refused._asdict(), "key": key, "suppressed": suppressed,
                              "refused_keys": self.refusals.total}
        more = f"; {suppressed} more from it since its last report" if suppressed else ""
        what = f"key {key}" if key != NO_KEY else "a connection"
        log.warning("refused %s from %s on %s (%s)%s", what, refused.peer, refused.domain, refused.reason, more)
        if self.report is not None:
            self.report(EventKind.key_refused, **fields)

    def role_of(self, user_id: str) -> Authorized | None:
        return self.roles.get(user_id.encode())

    def stop(self) -> None:
        """After the CURVE servers of `ctx` are closed, before the context is."""
        if self.watch is not None:
            self.watch.stop()
        self.auth.stop()


def _text(frames: list[bytes], index: int) -> str:
    return frames[index].decode(errors="replace") if len(frames) > index else "?"
