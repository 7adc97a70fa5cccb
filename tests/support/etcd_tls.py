"""Certificates (Debian's openssl) and etcd's users and roles for a TLS etcd in tests: CAs, server, clients, RBAC."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from elasticd.coordinator.etcd.client import b64, prefix_end
from support.system_deps import require_binary

ROOT_PASSWORD = "root-secret-4b1d"


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, signed by `ca`."""

    cert: Path
    key: Path
    ca: Path


class Authority:
    """A CA in `folder/name`, signing servers (for 127.0.0.1) and clients (by common name)."""

    def __init__(self, folder: Path, name: str) -> None:
        self.openssl = require_binary("openssl", "openssl")
        self.folder = folder / name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.cert, self.key = self.folder / "ca.crt", self.folder / "ca.key"
        self._run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", self.key, "-out", self.cert,
                  "-days", "2", "-subj", f"/CN={name} test CA")

    def _run(self, *args: str | Path) -> None:
        subprocess.run([self.openssl, *map(str, args)], check=True, capture_output=True, timeout=60)

    def issue(self, cn: str, server: bool = False, days: int = 2) -> Pair:
        """A client's certificate names it by organisation only: etcd's gateway refuses a CommonName while its
        authentication is on (it would not use it as the user)."""
        key, csr, cert = (self.folder / f"{cn}.{ext}" for ext in ("key", "csr", "crt"))
        self._run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj",
                  f"/CN={cn}" if server else f"/O={cn}")
        ext = self.folder / f"{cn}.ext"
        usage = "serverAuth,clientAuth" if server else "clientAuth"
        names = "subjectAltName=IP:127.0.0.1,DNS:localhost\n" if server else ""
        ext.write_text(f"extendedKeyUsage={usage}\n{names}")
        self._run("x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key, "-CAcreateserial", "-out", cert,
                  "-days", str(days), "-extfile", ext)
        return Pair(cert, key, self.cert)


def gateway(url: str, path: str, body: dict[str, object], client: Pair, token: str = "") -> dict[str, object]:
    """One request to etcd's JSON gateway over TLS with `client`'s certificate."""
    context = ssl.create_default_context(cafile=str(client.ca))
    context.load_cert_chain(str(client.cert), str(client.key))
    request = urllib.request.Request(url + "/v3/" + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": token} if token else {})
    with urllib.request.urlopen(request, timeout=5, context=context) as resp:
        answer: dict[str, object] = json.loads(resp.read())
        return answer


def enable_rbac(url: str, admin: Pair, users: dict[str, tuple[str, str]]) -> None:
    """etcd's authentication on, with `root` and a user per entry: name -> (password, the prefix its role may
    read and write; empty: a role with no rights at all)."""
    for name, (password, prefix) in {"root": (ROOT_PASSWORD, ""), **users}.items():
        gateway(url, "auth/user/add", {"name": name, "password": password}, admin)
        role = "root" if name == "root" else f"{name}-role"
        gateway(url, "auth/role/add", {"name": role}, admin)
        if prefix:
            grant(url, admin, role, prefix)
        gateway(url, "auth/user/grant", {"user": name, "role": role}, admin)
    gateway(url, "auth/enable", {}, admin)


def grant(url: str, admin: Pair, role: str, prefix: str, token: str = "") -> None:
    """`role` may read and write every key under `prefix`."""
    gateway(url, "auth/role/grant", {"name": role, "perm": {"key": b64(prefix), "range_end": b64(prefix_end(prefix)),
                                                             "permType": "READWRITE"}}, admin, token)


def set_rights(url: str, admin: Pair, role: str, prefix: str, granted: bool) -> None:
    """Grant `role` readwrite on `prefix`, or revoke it, as root, while authentication is on."""
    token = str(gateway(url, "auth/authenticate", {"name": "root", "password": ROOT_PASSWORD}, admin)["token"])
    if granted:
        grant(url, admin, role, prefix, token)
    else:
        gateway(url, "auth/role/revoke", {"role": role, "key": b64(prefix), "range_end": b64(prefix_end(prefix))},
                admin, token)
