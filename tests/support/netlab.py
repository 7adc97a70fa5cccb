"""Hosts for tests: network namespaces on one bridge, each with its own address; the root namespace is a third host.

Each namespace gets the /etc/hosts of a Debian-like machine (the hostname resolves to 127.0.1.1), the trap that
sends gloo to loopback on real clusters. Needs root and `ip`; without them the tests skip with the reason, and in
CI (CI=true) they fail instead, since CI runs as root and must run them.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
from pathlib import Path

from support.system_deps import require_binary, unavailable

ETC_NETNS = Path("/etc/netns")
LABS = itertools.count()  # labs made by this process


class Lab:
    """`hosts` namespaces joined by one bridge in the root namespace, which holds the subnet's .1."""

    def __init__(self, hosts: int) -> None:
        # Names and subnet by process and by lab: a lab whose teardown left something behind (`ip netns del` with a
        # daemon still inside) never collides with the next one in the same test process ("File exists").
        pid, n = os.getpid(), next(LABS)
        tag = f"{pid % 100000}{n % 10}"
        self.bridge = f"elbr{tag}"
        self.subnet = f"10.{200 + pid % 50}.{(pid + n) % 250}"
        self.names = [f"el{tag}h{i}" for i in range(hosts)]
        self.addrs = [f"{self.subnet}.{i + 2}" for i in range(hosts)]
        self.links = [f"el{tag}v{i}" for i in range(hosts)]  # the namespace's end of its veth pair

    def __enter__(self) -> Lab:
        if os.geteuid() != 0:
            unavailable("network namespaces need root")
        require_binary("ip", "iproute2")
        try:
            self._create()
        except subprocess.CalledProcessError as err:
            self.__exit__()
            unavailable(f"cannot create network namespaces: {err.stderr.strip() or err}")
        return self

    def _create(self) -> None:
        ip(f"link add {self.bridge} type bridge")
        ip(f"addr add {self.subnet}.1/24 dev {self.bridge}")
        ip(f"link set {self.bridge} up")
        for name, addr, link in zip(self.names, self.addrs, self.links, strict=True):
            ip(f"netns add {name}")
            hosts = ETC_NETNS / name / "hosts"
            hosts.parent.mkdir(parents=True, exist_ok=True)
            hosts.write_text(f"127.0.0.1 localhost\n127.0.1.1 {socket.gethostname()}\n")
            ip(f"link add {link} type veth peer name {link}p")
            ip(f"link set {link}p master {self.bridge}")
            ip(f"link set {link}p up")
            ip(f"link set {link} netns {name}")
            ip(f"netns exec {name} ip addr add {addr}/24 dev {link}")
            ip(f"netns exec {name} ip link set {link} up")
            ip(f"netns exec {name} ip link set lo up")

    def run_in(self, host: int) -> list[str]:
        """The command prefix that runs a program on host `host`."""
        return ["ip", "netns", "exec", self.names[host]]

    def __exit__(self, *_exc: object) -> None:
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)  # takes its veth pair along
            shutil.rmtree(ETC_NETNS / name, ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


def ip(args: str) -> None:
    subprocess.run(["ip", *args.split()], check=True, capture_output=True, text=True)
