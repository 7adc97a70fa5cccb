"""One round's c10d store, on loopback only: as `-m elasticd.member.store.store_host` it prints `READY PORT` and serves.

The daemon of the round's master node forks it from the zygote (torch is loaded there), or execs it. It binds a
fresh 127.0.0.1 port, says READY, and when the first client connects hands torch that listening socket
(`master_listen_fd`), so the store never listens on another interface; other nodes reach it only through the
daemons' CURVE store tunnel (store_tunnel.py). It serves until SIGTERM (or SIGKILL through PDEATHSIG when its
parent dies).

With an address argument (`-m elasticd.member.store.store_host ADDR`) it binds that address instead: the job's
long-lived store for in-place resizes (job_store.py). With --keys that is 127.0.0.1 too (reached through the tunnel);
without keys it is the coordinator's advertised address, which every node's workers reach directly.
"""

from __future__ import annotations

import select
import signal
import socket
import sys
from datetime import timedelta

READY = "READY"  # the first line on stdout: `READY PORT`
LOOPBACK = "127.0.0.1"
BACKLOG = 1024
# How long the store's own client may take to reach it: a local connect takes milliseconds, and a failure then
# exits with torch's reason in the daemon's log rather than waiting out the daemon's start timeout.
CONNECT_TIMEOUT = timedelta(seconds=10)


def main() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((sys.argv[1] if len(sys.argv) > 1 else LOOPBACK, 0))
    listener.listen(BACKLOG)
    addr, port = listener.getsockname()
    # Ready once the port listens: the first client's connection waits in the backlog while torch loads. An exec'd
    # host pays the import (~1 s of CPU) only when a worker uses the store, and overlaps it with the workers' own.
    print(f"{READY} {port}", flush=True)
    select.select([listener], [], [])
    import torch.distributed as dist  # preloaded in the zygote; only an exec'd store host pays the import

    # The master's own client connects to the address it listens on: loopback is another address than the job
    # store's (the coordinator's advertised one), and nothing would answer there.
    _store = dist.TCPStore(  # held until we die: dropping it would stop the server
        addr, port, None, is_master=True, wait_for_workers=False, timeout=CONNECT_TIMEOUT,
        master_listen_fd=listener.fileno())
    print(f"serving on {addr}:{port}", flush=True)
    while True:  # SIGTERM's default action ends us; the store serves from its own thread meanwhile
        signal.pause()


if __name__ == "__main__":
    main()
