"""Real etcd members on 127.0.0.1 for tests and benchmarks: start, kill one (or its raft leader), restart, clean up."""

from __future__ import annotations

import json
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticd.client import ClientError
from support.etcd_tls import Pair
from support.harness import Job, free_port

# Fast elections for tests (the minimum lease TTL is 1.5 x the election timeout: 750 ms).
FAST = ["--election-timeout", "500", "--heartbeat-interval", "50"]
READY_TIMEOUT_S = 20.0


class EtcdCluster:
    """`size` members with ports and data dirs of their own; `endpoints` is what --rdzv-endpoint takes."""

    def __init__(self, binary: str, tmp: Path, size: int = 1, enable_v2: bool = False,
                 host: str = "127.0.0.1", tls: Pair | None = None, admin: Pair | None = None,
                 flags: tuple[str, ...] = ()) -> None:
        """`host`: the address clients reach it on (a netlab bridge's, for daemons in namespaces). `tls`: the
        members' certificate; clients and peers then need one from its CA (`admin`'s, for our own requests)."""
        self.binary, self.size, self.enable_v2, self.host = binary, size, enable_v2, host
        self.tls, self.admin, self.flags = tls, admin, flags
        self.scheme = "https" if tls else "http"
        self.dirs = [tmp / f"etcd-{i}" for i in range(size)]
        self.client_ports = [free_port() for _ in range(size)]
        self.peer_ports = [free_port() for _ in range(size)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * size
        self.token = uuid.uuid4().hex[:12]

    @property
    def endpoints(self) -> str:
        return ",".join(f"{self.host}:{p}" for p in self.client_ports)

    def url(self, i: int) -> str:
        return f"{self.scheme}://{self.host}:{self.client_ports[i]}"

    def start(self) -> EtcdCluster:
        for i in range(self.size):
            self.start_member(i, state="new")
        for i in range(self.size):
            self.wait_ready(i)
        return self

    def start_member(self, i: int, state: str = "existing") -> None:
        peer = f"{self.scheme}://127.0.0.1:{{}}"
        cluster = ",".join(f"m{j}={peer.format(self.peer_ports[j])}" for j in range(self.size))
        args = [self.binary, "--name", f"m{i}", "--data-dir", str(self.dirs[i]),
                "--listen-client-urls", self.url(i), "--advertise-client-urls", self.url(i),
                "--listen-peer-urls", peer.format(self.peer_ports[i]),
                "--initial-advertise-peer-urls", peer.format(self.peer_ports[i]),
                "--initial-cluster", cluster, "--initial-cluster-state", state,
                "--initial-cluster-token", self.token, *FAST]
        if self.tls is not None:  # clients and peers alike: certificates from our CA only
            files = ["--cert-file", str(self.tls.cert), "--key-file", str(self.tls.key),
                     "--trusted-ca-file", str(self.tls.ca)]
            args += [*files, "--client-cert-auth", *(f"--peer-{a[2:]}" if a.startswith("--") else a for a in files),
                     "--peer-client-cert-auth"]
        if self.enable_v2:
            args.append("--enable-v2")
        args += self.flags
        log = open(self.dirs[i].with_suffix(".log"), "ab")  # noqa: SIM115 - the member's lifetime, closed by Popen
        self.procs[i] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def wait_ready(self, i: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url(i) + "/health", timeout=1, context=self.context()) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        return
            except OSError:
                pass
            proc = self.procs[i]
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.05)
        log = self.dirs[i].with_suffix(".log")
        raise AssertionError(f"etcd member m{i} not ready: {log.read_text()[-2000:] if log.exists() else ''}")

    def leader(self) -> int:
        """The index of the member that is raft leader now."""
        for i in self.alive():
            with urllib.request.urlopen(urllib.request.Request(
                    self.url(i) + "/v3/maintenance/status", data=b"{}", method="POST"), timeout=2,
                    context=self.context()) as resp:
                status = json.loads(resp.read())
            if status.get("leader") == status.get("header", {}).get("member_id"):
                return i
        raise AssertionError("no etcd leader")

    def context(self) -> ssl.SSLContext | None:
        """Our own requests' TLS: the members' CA and the admin's certificate."""
        if self.tls is None or self.admin is None:
            return None
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        context.load_cert_chain(str(self.admin.cert), str(self.admin.key))
        return context

    def alive(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None]

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)

    def kill_all(self) -> None:
        for i in range(self.size):
            self.kill(i)

    def restart(self) -> None:
        """The members that are down, again, on the data they had (the job's state with them)."""
        down = [i for i in range(self.size) if i not in self.alive()]
        for i in down:
            self.start_member(i)
        for i in down:
            self.wait_ready(i)

    def close(self) -> None:
        self.kill_all()
        for path in self.dirs:
            shutil.rmtree(path, ignore_errors=True)
            path.with_suffix(".log").unlink(missing_ok=True)

    def __enter__(self) -> EtcdCluster:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


LEASE_TTL = 2  # seconds: a dead coordinator is replaced within about this long


def etcd_job(tmp: Path, etcd: EtcdCluster, nnodes: str, conf: str = "", **kw: Any) -> Job:
    """`conf`: more --rdzv-conf settings (TLS, a login), after the short lease."""
    return Job(tmp, nnodes=nnodes, nproc=1, extra=["--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoints,
                                                   "--rdzv-conf", ",".join(filter(None, (f"lease_ttl={LEASE_TTL}",
                                                                                         conf)))], **kw)


def ask(job: Job, node: str, op: str, timeout: float = 30.0, **args: Any) -> dict[str, Any]:
    """A request to one daemon; while a coordinator is being replaced, forwarded requests time out: ask again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with job.client(node) as client:
                return client.call(op, **args)
        except ClientError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def wait_event(job: Job, node: str, kind: str, match: Callable[[dict[str, Any]], bool] = lambda e: True,
               since: int = 0, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in ask(job, node, "events", since_seq=since, kinds=[kind], limit=0)["events"]:
            if match(event):
                return event
        time.sleep(0.1)
    raise AssertionError(f"no {kind} after seq {since} at node {node}:\n{job.daemon(node).output()[-3000:]}")
