"""etcd's v3 API through its JSON gateway (etcd3gw): every endpoint tried in turn, one cluster only, plain txns."""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger("elasticd")
T = TypeVar("T")
MISSING_CLIENT = ("--rdzv-backend etcd needs the etcd3gw client, which is not installed: "
                  "pip install 'elastic[etcd]'")
REQUEST_TIMEOUT_S = 1.0  # per endpoint: a member that does not answer this fast is treated as down


class EtcdUnavailable(Exception):
    """No endpoint answered; the message names them and the last error."""


class EtcdClusterChanged(Exception):
    """An endpoint answered for another etcd cluster than the one this daemon started on."""


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


def load_etcd3gw() -> Any:
    try:
        import etcd3gw  # optional: only --rdzv-backend etcd needs it
    except ImportError:
        raise ImportError(MISSING_CLIENT) from None
    return etcd3gw


class EtcdClient:
    """One cluster reached through any of its endpoints; a connection error moves on to the next one.

    Thread-safe: each thread gets its own HTTP session (a keep-alive thread must never wait on a watch).
    """

    def __init__(self, endpoints: list[tuple[str, int]], timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.etcd3gw = load_etcd3gw()
        self.endpoints = endpoints
        self.timeout_s = timeout_s
        self.cluster_id = ""  # the first answer's; any later answer from another cluster is refused
        self._local = threading.local()
        self._lock = threading.Lock()
        self._current = 0  # the endpoint that answered last: tried first next time

    def _clients(self) -> dict[int, Any]:
        clients = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        return clients

    def _client(self, index: int) -> Any:
        clients = self._clients()
        if index not in clients:
            host, port = self.endpoints[index]
            clients[index] = self.etcd3gw.Etcd3Client(host=host, port=port, timeout=self.timeout_s,
                                                      api_path="/v3/")
        return clients[index]

    def call(self, action: Callable[[Any], T]) -> T:
        """Run `action(Etcd3Client)` on the endpoint that answered last, then on each other one."""
        errors = self.etcd3gw.exceptions
        first = self._current
        last: Exception | None = None
        for step in range(len(self.endpoints)):
            index = (first + step) % len(self.endpoints)
            try:
                result = action(self._client(index))
            except (errors.ConnectionFailedError, errors.ConnectionTimeoutError) as exc:
                last = exc
                continue
            if index != first:
                with self._lock:
                    self._current = index
                log.info("etcd: now using %s:%d", *self.endpoints[index])
            return result
        names = ",".join(f"{h}:{p}" for h, p in self.endpoints)
        raise EtcdUnavailable(f"no etcd endpoint answered ({names}): {_short(last)}")

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One gateway request; its answer's cluster id must be ours."""
        result: dict[str, Any] = self.call(lambda c: c.post(c.get_url(path), data=json.dumps(body)))
        self.check_cluster(str(result.get("header", {}).get("cluster_id", "")))
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
    def status(self) -> dict[str, Any]:
        return self.post("/maintenance/status", {})

    def grant(self, ttl_s: int) -> int:
        return int(self.post("/lease/grant", {"TTL": ttl_s, "ID": 0})["ID"])

    def refresh(self, lease: int) -> int:
        """The lease's TTL after a keep-alive; -1 once it has expired (or was revoked)."""
        result = self.post("/lease/keepalive", {"ID": lease})
        return int(result.get("result", {}).get("TTL", -1))

    def revoke(self, lease: int) -> None:
        self.post("/kv/lease/revoke", {"ID": lease})

    def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]],
            failure: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return self.post("/kv/txn", {"compare": compare, "success": success, "failure": failure or []})

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under `prefix` in key order, and the store's revision they were read at."""
        result = self.post("/kv/range", {"key": b64(prefix), "range_end": b64(prefix_end(prefix))})
        return [kv_of(item) for item in result.get("kvs", [])], int(result["header"]["revision"])

    def wait_change(self, prefix: str, after_revision: int, timeout_s: float) -> bool:
        """Block until a key under `prefix` changes after `after_revision`; False when `timeout_s` passed first."""
        body = {"create_request": {"key": b64(prefix), "range_end": b64(prefix_end(prefix)),
                                   "start_revision": after_revision + 1}}

        def watch(c: Any) -> bool:
            requests = c.session
            try:
                resp = requests.post(c.get_url("/watch"), data=json.dumps(body), stream=True,
                                     timeout=(self.timeout_s, timeout_s))
            except Exception as exc:  # requests' own errors: connection refused, timeouts
                raise self.etcd3gw.exceptions.ConnectionFailedError(str(exc)) from None
            try:
                for line in resp.iter_lines():
                    result = json.loads(line or b"{}").get("result", {})
                    if result.get("events") or result.get("compact_revision"):
                        return True
            except Exception as exc:
                if "timed out" in str(exc).lower() or "Read timed out" in repr(exc):
                    return False
                raise self.etcd3gw.exceptions.ConnectionFailedError(str(exc)) from None
            finally:
                resp.close()
            return False

        return self.call(watch)


def kv_of(item: dict[str, Any]) -> KeyValue:
    return KeyValue(base64.b64decode(item["key"]).decode(), base64.b64decode(item.get("value", "")),
                    int(item.get("create_revision", 0)), int(item.get("mod_revision", 0)), int(item.get("lease", 0)))


def put(key: str, value: bytes | str, lease: int = 0) -> dict[str, Any]:
    """A txn operation: put `key`, bound to `lease` when one is given."""
    request: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        request["lease"] = lease
    return {"request_put": request}


def delete(key: str, range_end: str = "") -> dict[str, Any]:
    request = {"key": b64(key)}
    if range_end:
        request["range_end"] = b64(range_end)
    return {"request_delete_range": request}


def created_at(key: str, revision: int) -> dict[str, Any]:
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
