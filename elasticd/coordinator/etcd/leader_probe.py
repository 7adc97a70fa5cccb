"""A dead coordinator's lease revoked at once: its host refuses its mesh port, so the next daemon need not wait.

A member's link to the coordinator drops for three reasons: the coordinator's process died (its kernel closed the
connection and now refuses the port), it is frozen (the port still accepts: the kernel queues the connection), or
the network between us is cut (a connect times out or is unreachable). Only the first is certain death, so only a
refused connect revokes the leader's lease; the other two keep the lease rule (docs/architecture.md, "Coordinator
failover"). Fencing is unchanged: a revoked lease fails every write of its epoch, and members drop its frames once
the next epoch speaks.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from elasticd.coordinator.etcd.election import Leader

# ZeroMQ reconnects every 0.1 s: a link still down after this is not a passing blip. Shorter than the coordinator's
# RECONNECT_GRACE_S for a member's link, which decides on the closed link alone; here a refused connect decides.
PROBE_AFTER_S = 0.2
PROBE_TIMEOUT_S = 1.0  # a connect that neither succeeds nor is refused within this is a cut network, not a death


async def refuses_connections(endpoint: str) -> bool:
    """Whether the host of `endpoint` (tcp://host:port) answers a connect with a refusal: nothing listens there."""
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp" or not parts.hostname or not parts.port:
        return False
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port), PROBE_TIMEOUT_S)
    except ConnectionRefusedError:
        return True
    except (OSError, asyncio.TimeoutError):  # unreachable, or no answer: the network's doing, not a death
        return False
    writer.close()  # it listens (alive, or frozen with its port open): the lease decides
    return False


def lease_of(leader: Leader) -> int:
    """The lease behind a candidacy: its key is `<prefix>leader/<lease in hex>` (etcd/election.py)."""
    return int(leader.key.rsplit("/", 1)[-1], 16)
