"""Our way into etcd: TLS with the job's CA pinned, the client certificate checked, and why etcd said no, in words."""

from __future__ import annotations

import base64
import datetime
import json
import math
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elasticd.coordinator.etcd.errors import EtcdRefused
from elasticd.job.config import EtcdAccess

if TYPE_CHECKING:  # optional, with etcd3gw (the `etcd` extra)
    import requests

TOKEN_MARGIN_S = 30.0  # a JWT is renewed this long before it expires (a short-lived one sooner)


def pinned_session(access: EtcdAccess) -> requests.Session:
    """A session whose CA, when the job names one, is that one whatever the environment says: requests lets
    REQUESTS_CA_BUNDLE (set on many corporate hosts) override a session's `verify`, and a TLS etcd then fails with
    "unable to get local issuer". Without `cacert`, the environment's CAs verify etcd, as for any requests user."""
    import requests  # with etcd3gw

    class PinnedSession(requests.Session):
        def merge_environment_settings(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            settings: dict[str, Any] = super().merge_environment_settings(*args, **kwargs)
            settings["verify"] = self.verify
            return settings

    session = PinnedSession() if access.cacert else requests.Session()
    if access.cacert:
        session.verify = access.cacert
    if access.cert:
        session.cert = (access.cert, access.key)
    return session


def check_files(access: EtcdAccess) -> None:
    """The CA, certificate and key are PEM, belong together and are in date: else one line, before any request."""
    try:
        context = ssl.create_default_context(cafile=access.cacert or None)
        if access.cert:
            context.load_cert_chain(access.cert, access.key)
    except (ssl.SSLError, OSError) as exc:
        which = f"cert={access.cert}, key={access.key}" if access.cert else f"cacert={access.cacert}"
        raise EtcdRefused(f"cannot use {which}: {exc.args[-1] if exc.args else exc} (a PEM certificate and the "
                          "key it was issued for)") from None
    if access.cert:
        _in_date(access.cert)


def _in_date(path: str) -> None:
    try:
        from cryptography import x509  # with etcd3gw (the `etcd` extra)
    except ImportError:  # an older install: etcd's handshake refuses an expired certificate instead
        return

    cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
    now = datetime.datetime.now(datetime.timezone.utc)
    if now > cert.not_valid_after_utc:
        raise EtcdRefused(f"cert={path} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: etcd would refuse "
                          "it; issue a new one")
    if now < cert.not_valid_before_utc:
        raise EtcdRefused(f"cert={path} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC "
                          "(is this host's clock right?)")


def password_source(access: EtcdAccess) -> Callable[[], str]:
    """Where our login's password comes from. A file is read at each login, so a rotated secret (a Kubernetes
    Secret's file) is picked up; a variable is taken out of our environment at once, so that no zygote, worker or
    --on-event hook inherits it."""
    if access.password_file:
        path = access.password_file

        def read() -> str:
            try:
                return Path(path).read_text().strip()
            except OSError as exc:
                raise EtcdRefused(f"cannot read password_file={path}: {exc.strerror}") from None
        return read
    value = os.environ.pop(access.password_env, "") if access.password_env else ""
    return lambda: value


def renew_at(token: str, now: float) -> float:
    """When to log in again: a JWT a third of its life (at most TOKEN_MARGIN_S) before it expires; etcd's simple
    tokens never (they live as long as they are used, and one that lapsed is renewed when etcd says so)."""
    parts = token.split(".")
    if len(parts) != 3:
        return math.inf
    try:
        expires = float(json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))["exp"])
    except (ValueError, KeyError, TypeError):
        return math.inf
    return expires - min(TOKEN_MARGIN_S, max(0.0, expires - now) / 3)


def tls_failure(text: str, access: EtcdAccess) -> str:
    """What a failed TLS connection means, from requests' message; empty when it was no TLS failure."""
    if "CERTIFICATE_VERIFY_FAILED" in text:
        why = "has expired" if "expired" in text else f"is not signed by cacert={access.cacert or '(the system CAs)'}"
        return f"etcd's certificate {why}"
    if "WRONG_VERSION_NUMBER" in text or "wrong version number" in text:
        return "etcd answers in plain HTTP there: drop protocol=https, or give etcd's https endpoints"
    if "SSLError" in text or "SSLEOFError" in text or "alert" in text:
        ours = f"cert={access.cert}" if access.cert else "none given (cert=, key=)"
        return (f"etcd refused our TLS handshake: it wants a client certificate from its CA; ours: {ours} "
                "(or it serves plain HTTP there: then drop protocol=https)")
    return ""


def refusal(text: str, access: EtcdAccess, prefix: str) -> str:
    """What one of etcd's refusals means for us, from its answer's text; empty for anything else."""
    if "Client sent an HTTP request to an HTTPS server" in text:
        return "etcd wants TLS there: give protocol=https and cacert= (and cert=, key= if it checks clients)"
    if "invalid user ID or password" in text:
        return f"etcd login as {access.user!r} failed: wrong user or password"
    if "user name is empty" in text:
        return "etcd's authentication is on: give user= and password_file= or password_env="
    if "CommonName of client" in text:
        return ("etcd's gateway refuses a client certificate with a CommonName while its authentication is on: "
                "issue ours without a CN (etcd would not use it as the user) and log in with user=")
    if "permission denied" in text:
        who = f"user {access.user!r}" if access.user else "we"
        return f"etcd: {who} may not read and write {prefix}: grant its role readwrite on that prefix"
    if "authentication is not enabled" in text:
        return "etcd's authentication is off: drop user= and the password setting"
    return ""
