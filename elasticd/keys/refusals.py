"""Refused CURVE handshakes: every one counted, each peer and key reported at most once a window, floods bounded."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from zmq.utils import z85

REPORT_WINDOW_S = 10.0  # one event per peer address + key + domain in this long
MAX_REPORTS_PER_WINDOW = 20  # across all peers: a flood of fresh keys or addresses stays bounded too
MAX_TRACKED = 1024  # peers remembered; past this the quiet ones are forgotten (their refusals stay counted)
FINGERPRINT_CHARS = 8  # of the z85 public key: enough to grep `elasticd keys list` or a key file


@dataclass
class _Peer:
    """What was last reported of one refused peer, and how much was held back since."""

    reported_at: float = -math.inf  # never reported yet: a refusal held back by the global cap
    suppressed: int = 0


class RefusalLog:
    """Counts refusals (`total`, `by_domain`, for status and a metrics exporter) and says which to report."""

    def __init__(self, window_s: float = REPORT_WINDOW_S, max_reports: int = MAX_REPORTS_PER_WINDOW) -> None:
        self.window_s, self.max_reports = window_s, max_reports
        self.total = 0
        self.by_domain: Counter[str] = Counter()
        self._peers: dict[tuple[str, str, str], _Peer] = {}
        self._window_start, self._reports = -math.inf, 0

    def record(self, domain: str, address: str, fingerprint: str, now: float) -> int | None:
        """Count one refusal. To report it: how many of this peer's went unreported since its last report; else None."""
        self.total += 1
        self.by_domain[domain] += 1
        key = (domain, address, fingerprint)
        self._forget_quiet(now)
        peer = self._peers.setdefault(key, _Peer())
        if now - peer.reported_at < self.window_s or not self._take_report(now):
            peer.suppressed += 1
            return None
        suppressed = peer.suppressed
        peer.reported_at, peer.suppressed = now, 0
        return suppressed

    def _take_report(self, now: float) -> bool:
        if now - self._window_start >= self.window_s:
            self._window_start, self._reports = now, 0
        if self._reports >= self.max_reports:
            return False
        self._reports += 1
        return True

    def _forget_quiet(self, now: float) -> None:
        if len(self._peers) < MAX_TRACKED:
            return
        self._peers = {k: p for k, p in self._peers.items() if now - p.reported_at < self.window_s}
        while len(self._peers) > MAX_TRACKED // 2:  # all recent: drop the first seen, leave room to grow
            del self._peers[next(iter(self._peers))]


def fingerprint(public_key: bytes) -> str:
    """The first characters of a raw 32-byte CURVE public key in z85, as `elasticd keys list` prints it."""
    if len(public_key) != 32:
        return "-"
    return z85.encode(public_key).decode()[:FINGERPRINT_CHARS]
