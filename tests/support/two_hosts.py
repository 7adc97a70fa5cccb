"""Two hosts (network namespaces of support/netlab.py) running one job, with the job's CURVE keys or `--insecure`;
what listens on a host, and whether a c10d store answers a stranger."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from elasticd.client import Credentials
from elasticd.keys.auth import KeyStore
from support.harness import PLAIN, DaemonProc, Job
from support.netlab import Lab

IFNAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
A, B = "gpu-node-017.example.internal", "gpu-node-018.example.internal"  # node ids are hostnames, dots and all


class TwoHosts:
    """Node A on host 0 (it holds the coordinator), node B on host 1: with the job's keys, or `--insecure`."""

    def __init__(self, lab: Lab, tmp: Path, keys: bool = True, nproc: int = 1, script: Path = PLAIN,
                 args: tuple[str, ...] = ()) -> None:
        self.lab, self.tmp, self.script = lab, tmp, script
        self.args = args or ("--steps", "100000", "--snapshot", str(tmp / "snapshot.pt"), "--step-time", "0.05")
        self.job = Job(tmp, nnodes="1:2", nproc=nproc, rdzv_host=lab.addrs[0])
        self.job.env = {k: v for k, v in self.job.env.items() if k not in IFNAMES}
        self.security, self.auth = ["--insecure"], []  # --keys and the credentials of `cli` with keys
        if keys:
            store = KeyStore(tmp / "keys")
            store.init()
            self.key, self.server_key = str(store.create_client("ops", "operator")), str(store.node_dir / "node.key")
            self.job.credentials = Credentials.load(self.key, self.server_key)
            self.security = ["--keys", str(tmp / "keys")]
            self.auth = ["--key", self.key, "--server-key", self.server_key]

    def start(self, node: str, host: int) -> DaemonProc:
        addr = self.lab.addrs[host]
        return self.job.start(node, self.script, *self.args, prefix=self.lab.run_in(host),
                              extra=[*self.security, "--control", f"tcp://{addr}:*", "--pub", f"tcp://{addr}:*"])

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """An `elasticd` verb run on the third host, the root namespace, against node a."""
        return subprocess.run([sys.executable, "-m", "elasticd.cli", *args, "--connect", self.job.daemon(A).control,
                               *self.auth], env=self.job.env, capture_output=True, text=True, timeout=30)


def listeners(lab: Lab, host: int) -> list[tuple[str, int, set[int]]]:
    """Every listening TCP socket on that host: (address, port, owner pids)."""
    out = subprocess.run([*lab.run_in(host), "ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        addr, _, port = line.split()[3].rpartition(":")
        found.append((addr.strip("[]"), int(port), {int(p) for p in re.findall(r"pid=(\d+)", line)}))
    return found


def store_answers(addr: str, port: int) -> bool:
    """Whether a c10d store client from here can write and read a key there."""
    from torch.distributed import TCPStore

    try:
        store = TCPStore(addr, port, None, is_master=False, timeout=timedelta(seconds=3))
        store.set("stranger", "was here")
        return store.get("stranger") == b"was here"
    except Exception:  # refused, reset, or timed out: what a stranger should get
        return False
