"""TCP sockets the kernel frees in this network namespace, with their addresses: Linux's sock_diag destroy feed."""

from __future__ import annotations

import socket
import struct
from typing import NamedTuple

NETLINK_SOCK_DIAG = 4
GROUP_TCP_DESTROY = 1  # SKNLGRP_INET_TCP_DESTROY, IPv4; the kernel lets any user listen (NL_CFG_F_NONROOT_RECV)
HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
# inet_diag_msg, up to the addresses: family, state, timer, retrans, then sport, dport, src and dst in network order
ADDRESSES = struct.Struct("!BBBBHH4s12x4s")
MAX_READS = 4096  # datagrams read in one go: a storm of closing connections still lets the watch get on
BUFFER_BYTES = 1 << 20  # the kernel caps it (net.core.rmem_max); a full feed drops news (ENOBUFS) until read


class Closed(NamedTuple):
    """A TCP socket the kernel freed: our port, and the peer's address."""

    port: int  # local
    ip: str  # the peer's
    peer_port: int


class ClosedFeed:
    """A non-blocking subscription; `sock` is None where there is no such feed (not Linux, no sock_diag)."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
        except (AttributeError, OSError):
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
            sock.bind((0, 1 << (GROUP_TCP_DESTROY - 1)))
            sock.setblocking(False)
        except OSError:
            sock.close()
            return
        self.sock = sock

    def read(self) -> list[Closed]:
        """Every socket freed since the last read."""
        found: list[Closed] = []
        if self.sock is None:
            return found
        for _ in range(MAX_READS):
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                break
            except OSError:  # ENOBUFS: the feed overflowed and says so once; read on
                continue
            found += parse(data)
        return found

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def parse(data: bytes) -> list[Closed]:
    """The sockets in one datagram of netlink messages, each an inet_diag_msg."""
    found = []
    offset = 0
    while offset + HEADER.size <= len(data):
        length = HEADER.unpack_from(data, offset)[0]
        body = offset + HEADER.size
        if length < HEADER.size or body + ADDRESSES.size > len(data):
            break
        family, _, _, _, port, peer_port, _, peer = ADDRESSES.unpack_from(data, body)
        if family == socket.AF_INET:
            found.append(Closed(port, socket.inet_ntoa(peer), peer_port))
        offset += (length + 3) & ~3  # NLMSG_ALIGN
    return found
