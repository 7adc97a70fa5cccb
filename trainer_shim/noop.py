"""The quiet stand-in session for plain torchrun or a single process: same methods, nothing sent."""

from __future__ import annotations

from trainer_shim.session import Request


class NullSession:
    """No daemon: reports vanish, no request ever arrives, so training runs exactly as without the shim."""

    enabled = False

    def __init__(self, rank: int = 0, local_rank: int = 0) -> None:
        self.rank, self.local_rank, self.node, self.round = rank, local_rank, "", 0
        self.dropped = 0
        self.sent = 0
        self.last_request_id: str | None = None

    def report(self, step: int, loss: float | None = None, samples: int = 0, tokens: int = 0,
               **metrics: float) -> None:
        return None

    def report_checkpoint(self, step: int, path: str, nbytes: int, duration_s: float,
                          request_id: str | None = None) -> None:
        return None

    def report_skipped(self, path: str, reason: str) -> None:
        return None

    def drained(self, step: int, request_id: str | None = None) -> None:
        return None

    def poll(self) -> None:
        return None

    def should_checkpoint(self, step: int) -> bool:
        return False

    def should_stop(self, step: int) -> bool:
        return False

    def should_resize(self, step: int) -> bool:
        return False

    @property
    def pending(self) -> list[Request]:
        return []

    def close(self) -> None:
        return None

    def __enter__(self) -> NullSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
