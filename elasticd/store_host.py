"""One round's c10d store, on loopback only: run as `-m elasticd.store_host`, it prints `READY PORT` and serves.

The daemon of the round's master node forks it from the zygote (torch is loaded there), or execs it. It binds a
fresh 127.0.0.1 port and hands torch that listening socket (`master_listen_fd`), so the store never listens on
another interface; other nodes reach it only through the daemons' CURVE store tunnel (elasticd/store_tunnel.py).
It serves until SIGTERM (or SIGKILL through PDEATHSIG when its parent dies).

With an address argument (`-m elasticd.store_host ADDR`) it binds that address instead: the job's long-lived store
for in-place resizes (elasticd/job_store.py), which every node's workers reach directly.
"""

from __future__ import annotations

import signal
import socket
import sys

READY = "READY"  # the first line on stdout: `READY PORT`
LOOPBACK = "127.0.0.1"
BACKLOG = 1024


def main() -> None:
    import torch.distributed as dist  # preloaded in the zygote; only an exec'd store host pays the import

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((sys.argv[1] if len(sys.argv) > 1 else LOOPBACK, 0))
    listener.listen(BACKLOG)
    port = listener.getsockname()[1]
    _store = dist.TCPStore(  # held until we die: dropping it would stop the server
        LOOPBACK, port, None, is_master=True, wait_for_workers=False, master_listen_fd=listener.fileno())
    print(f"{READY} {port}", flush=True)
    while True:  # SIGTERM's default action ends us; the store serves from its own thread meanwhile
        signal.pause()


if __name__ == "__main__":
    main()
