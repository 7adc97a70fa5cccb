"""etcd's v3 API through its JSON gateway (etcd3gw): every endpoint tried in turn, one cluster only, plain txns."""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from elasticd.coordinator.etcd.access import pinned_session, refusal, renew_at, tls_failure
from elasticd.coordinator.etcd.errors import EtcdClusterChanged, EtcdRefused, EtcdUnavailable
from elasticd.job.config import EtcdAccess
from elasticd.wire.protocol import Json, JsonObject

if TYPE_CHECKING:  # optional: only --rdzv-backend etcd needs it, and loads it (load_etcd3gw)
    from etcd3gw import Etcd3Client

log = logging.getLogger("elasticd")
T = TypeVar("T")
Compare = dict[str, str | int]  # one txn comparison (created_at)
TxnOp = dict[str, dict[str, str | int]]  # one txn operation: {"request_put": {…}} (put) or a delete (delete)
MISSING_CLIENT = ("--rdzv-backend etcd needs the etcd3gw client, which is not installed: "
                  "pip install 'elastic[etcd]'")
REQUEST_TIMEOUT_S = 1.0  # per endpoint: a member that does not answer this fast is treated as down
# etcd's refusals of a token that a new login cures (go.etcd.io/etcd/api/v3rpc/rpctypes)
STALE_TOKEN = ("etcdserver: invalid auth token", "etcdserver: revision of auth store is old")


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd returns it, with the revisions that order and fence it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with `prefix` (etcd's WithPrefix)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def load_etcd3gw() -> type[Etcd3Client]:
    try:
        from etcd3gw import Etcd3Client  # optional: only --rdzv-backend etcd needs it
    except ImportError:
        raise ImportError(MISSING_CLIENT) from None
    return Etcd3Client


class EtcdClient:
    """One cluster reached through any of its endpoints; a connection error moves on to the next one.

    Thread-safe: each thread gets its own HTTP session (a keep-alive thread must never wait on a watch).
    """

    def __init__(self, endpoints: list[tuple[str, int]], timeout_s: float = REQUEST_TIMEOUT_S,
                 access: EtcdAccess | None = None, prefix: str = "/",
                 password: Callable[[], str] = lambda: "") -> None:
        self.client_class = load_etcd3gw()
        self.endpoints = endpoints
        self.timeout_s = timeout_s
        self.access, self.prefix = access or EtcdAccess(), prefix  # prefix: where our rights must reach
        self.password = password  # our login's (access.password_source)
        self.cluster_id = ""  # the first answer's; any later answer from another cluster is refused
        self._local = threading.local()
        self._lock = threading.Lock()
        self._current = 0  # the endpoint that answered last: tried first next time
        self._token, self._token_until = "", 0.0  # etcd's authentication: shared by every thread's session

    def _clients(self) -> dict[int, Etcd3Client]:
        clients = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        return clients

    def _client(self, index: int) -> Etcd3Client:
        clients = self._clients()
        if index not in clients:
            host, port = self.endpoints[index]
            clients[index] = self.client_class(host=host, port=port, protocol=self.access.protocol, api_path="/v3/",
                                               timeout=self.timeout_s, session=pinned_session(self.access))
        return clients[index]

    def call(self, action: Callable[[Etcd3Client], T]) -> T:
        """Run `action(Etcd3Client)` on the endpoint that answered last, then on each other one."""
        from etcd3gw import exceptions as errors  # loaded with the client (load_etcd3gw)

        first = self._current
        last: Exception | None = None
        for step in range(len(self.endpoints)):
            index = (first + step) % len(self.endpoints)
            try:
                result = self._authorized(self._client(index), action)
            except (errors.ConnectionFailedError, errors.ConnectionTimeoutError) as exc:
                last = exc
                continue
            except errors.Etcd3Exception as exc:
                raise self._refused(exc) from None
            if index != first:
                with self._lock:
                    self._current = index
                log.info("etcd: now using %s:%d", *self.endpoints[index])
            return result
        names = ",".join(f"{h}:{p}" for h, p in self.endpoints)
        text = str(getattr(last, "detail_text", "") or last)
        tls = tls_failure(text, self.access)
        if tls:  # every endpoint said the same: a setting to change, not an outage to wait out
            raise EtcdRefused(f"{tls} ({names})")
        hint = " (an etcd that serves TLS there hangs up on plain HTTP: protocol=https,cacert=...)" \
            if self.access.protocol == "http" and "RemoteDisconnected" in text else ""
        raise EtcdUnavailable(f"no etcd endpoint answered ({names}): {_short(last)}{hint}")

    def _authorized(self, client: Etcd3Client, action: Callable[[Etcd3Client], T]) -> T:
        """`action` with our token (logged in when we have none, or ours is due); once more, logged in again, after
        etcd refused ours (`STALE_TOKEN`): expired (a simple token left unused past etcd's --auth-token-ttl), or
        issued before an admin changed a user or role (a JWT carries the auth store's revision; a simple token meets
        it when the change lands during the request). etcd applied nothing it refused so: the retry is safe."""
        if not self.access.user:
            return action(client)
        from etcd3gw import exceptions as errors

        for attempt in range(2):
            with self._lock:
                token = self._token if self._token and time.time() < self._token_until else ""
            client.session.headers["Authorization"] = token or self._login(client)
            try:
                return action(client)
            except errors.Etcd3Exception as exc:
                if attempt or not any(text in str(exc.detail_text) for text in STALE_TOKEN):
                    raise
                with self._lock:
                    self._token = ""
        raise AssertionError("unreachable")

    def _login(self, client: Etcd3Client) -> str:
        client.session.headers.pop("Authorization", None)
        body = {"name": self.access.user, "password": self.password()}
        answer = client.post(client.get_url("/auth/authenticate"), data=json.dumps(body))
        token = str(answer.get("token", "")) if isinstance(answer, dict) else ""
        with self._lock:
            self._token, self._token_until = token, renew_at(token, time.time())
        return token

    def _refused(self, exc: Exception) -> Exception:
        """etcd's refusal as one line that says which setting to change; any other answer as it was."""
        why = refusal(str(getattr(exc, "detail_text", "") or ""), self.access, self.prefix)
        return EtcdRefused(why) if why else exc

    def post(self, path: str, body: Mapping[str, Json]) -> JsonObject:
        """One gateway request; its answer's cluster id must be ours."""
        result: Json = self.call(lambda c: c.post(c.get_url(path), data=json.dumps(body)))
        if not isinstance(result, dict):
            raise ValueError(f"etcd answered {path} with {type(result).__name__}, not an object")
        self.check_cluster(str(_at(result, "header", "cluster_id") or ""))
        return result

    def check_cluster(self, cluster_id: str) -> None:
        if not cluster_id:
            return
        with self._lock:
            if not self.cluster_id:
                self.cluster_id = cluster_id
            elif cluster_id != self.cluster_id:
                raise EtcdClusterChanged(f"etcd answered for cluster {cluster_id}, but this job's is "
                                         f"{self.cluster_id}: refusing another cluster's state")

    # ---- the calls we use ----------------------------------------------------------------------
    def status(self) -> JsonObject:
        return self.post("/maintenance/status", {})

    def grant(self, ttl_s: int) -> int:
        return _int(self.post("/lease/grant", {"TTL": ttl_s, "ID": 0}).get("ID"))

    def refresh(self, lease: int) -> int:
        """The lease's TTL after a keep-alive; -1 once it has expired (or was revoked)."""
        return _int(_at(self.post("/lease/keepalive", {"ID": lease}), "result", "TTL"), -1)

    def revoke(self, lease: int) -> None:
        self.post("/kv/lease/revoke", {"ID": lease})

    def txn(self, compare: list[Compare], success: list[TxnOp], failure: list[TxnOp] | None = None) -> JsonObject:
        return self.post("/kv/txn", {"compare": compare, "success": success, "failure": failure or []})

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under `prefix` in key order, and the store's revision they were read at."""
        result = self.post("/kv/range", {"key": b64(prefix), "range_end": b64(prefix_end(prefix))})
        kvs = result.get("kvs")  # absent where no key matches
        return [kv_of(item) for item in (kvs if isinstance(kvs, list) else [])], \
            _int(_at(result, "header", "revision"))

    def wait_change(self, prefix: str, after_revision: int, timeout_s: float) -> bool:
        """Block until a key under `prefix` changes after `after_revision`; False when `timeout_s` passed first."""
        body = {"create_request": {"key": b64(prefix), "range_end": b64(prefix_end(prefix)),
                                   "start_revision": after_revision + 1}}

        def watch(c: Etcd3Client) -> bool:
            from etcd3gw.exceptions import ConnectionFailedError

            requests = c.session
            try:
                resp = requests.post(c.get_url("/watch"), data=json.dumps(body), stream=True,
                                     timeout=(self.timeout_s, timeout_s))
            except Exception as exc:  # requests' own errors: connection refused, timeouts
                raise ConnectionFailedError(str(exc)) from None
            try:
                for line in resp.iter_lines():
                    answer: Json = json.loads(line or b"{}")
                    if _at(answer, "result", "events") or _at(answer, "result", "compact_revision"):
                        return True
            except Exception as exc:
                if "timed out" in str(exc).lower() or "Read timed out" in repr(exc):
                    return False
                raise ConnectionFailedError(str(exc)) from None
            finally:
                resp.close()
            return False

        return self.call(watch)


def kv_of(item: Json) -> KeyValue:
    """One key of a range's answer: key and value in base64, revisions and lease in strings (JSON's int64s)."""
    return KeyValue(_bytes(_at(item, "key")).decode(), _bytes(_at(item, "value"), b""),
                    _int(_at(item, "create_revision"), 0), _int(_at(item, "mod_revision"), 0),
                    _int(_at(item, "lease"), 0))


def _at(value: Json, *keys: str) -> Json:
    """value[key][key]…; None where a key is missing or what should hold it is no object."""
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _int(value: Json, missing: int | None = None) -> int:
    """An int64 of an answer (the gateway writes it as a string); `missing` for none, where one may be missing."""
    if value is None and missing is not None:
        return missing
    if isinstance(value, str | int | float):
        return int(value)
    raise ValueError(f"etcd answered {value!r} where a number belongs")


def _bytes(value: Json, missing: bytes | None = None) -> bytes:
    """A bytes field of an answer, which the gateway writes in base64."""
    if value is None and missing is not None:
        return missing
    if isinstance(value, str):
        return base64.b64decode(value)
    raise ValueError(f"etcd answered {value!r} where base64 belongs")


def put(key: str, value: bytes | str, lease: int = 0) -> TxnOp:
    """A txn operation: put `key`, bound to `lease` when one is given."""
    request: dict[str, str | int] = {"key": b64(key), "value": b64(value)}
    if lease:
        request["lease"] = lease
    return {"request_put": request}


def delete(key: str, range_end: str = "") -> TxnOp:
    request: dict[str, str | int] = {"key": b64(key)}
    if range_end:
        request["range_end"] = b64(range_end)
    return {"request_delete_range": request}


def created_at(key: str, revision: int) -> Compare:
    """A txn compare: `key` exists with this create revision (0: `key` does not exist)."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": revision}


def _short(exc: Exception | None) -> str:
    """etcd3gw keeps requests' message in `detail_text`; its last clause says what happened (refused, timed out)."""
    text = str(getattr(exc, "detail_text", "") or exc or "no endpoint")
    if "Connection refused" in text:
        return "connection refused"
    if "timed out" in text.lower():
        return "timed out"
    if "ended prematurely" in text or "Connection aborted" in text:
        return "connection lost"
    return text.splitlines()[0][-160:] if text else type(exc).__name__
