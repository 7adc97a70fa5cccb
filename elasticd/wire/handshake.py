"""Why a client socket's CURVE handshake failed, from its ZeroMQ monitor, as one line that names the endpoint."""

from __future__ import annotations

from typing import NamedTuple

import zmq
from zmq.utils.monitor import parse_monitor_message

FAILED = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
WATCHED = FAILED | zmq.EVENT_HANDSHAKE_SUCCEEDED  # libzmq >= 4.3
KEY_REFUSED, KEY_REQUIRED, KEY_MISMATCH = "key_refused", "key_required", "key_mismatch"  # ClientError codes
CODES = (KEY_REFUSED, KEY_REQUIRED, KEY_MISMATCH)


class Failure(NamedTuple):
    """A handshake failure: a short code and a line that says why."""

    code: str
    reason: str


def explain(event: int, endpoint: str, keyed: bool) -> Failure:
    """A failed handshake, told from the client's side: it knows only whether it offered a key."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:  # the daemon's ZAP handler said no: only a keyed daemon does
        return Failure(KEY_REFUSED, f"{endpoint} refused our key (not authorized for this job; ask an operator "
                                    "for one: elasticd keys create NAME)")
    if not keyed:  # plain against CURVE: the daemon hangs up on the greeting (mechanism mismatch)
        return Failure(KEY_REQUIRED, f"{endpoint} requires a key: its job was started with --keys; pass "
                                     "--key FILE (your .key_secret)")
    return Failure(KEY_MISMATCH, f"{endpoint} broke off the key handshake: its job runs without keys (drop "
                                 "--key), or --server-key is not the job's node key")


class Handshake:
    """The latest handshake outcome of one client socket; `failure` is None until one fails."""

    def __init__(self, endpoint: str, keyed: bool) -> None:
        self.endpoint, self.keyed = endpoint, keyed
        self.failure: Failure | None = None

    def feed(self, frames: list[bytes]) -> Failure | None:
        """One monitor message; a later success clears an earlier failure (a daemon restarted with keys)."""
        event = int(parse_monitor_message(frames)["event"])
        if event & FAILED:
            self.failure = explain(event, self.endpoint, self.keyed)
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.failure = None
        return self.failure
