"""The framework-neutral half of the integration callbacks: report steps, take due requests, say drained."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

import trainer_shim
from elasticd.wire.names import WorkerOp
from trainer_shim.noop import NullSession
from trainer_shim.session import Session


def missing(framework: str, extra: str, exc: ImportError) -> ImportError:
    """The error an integration module raises when its framework is not installed."""
    return ImportError(f"trainer_shim.integrations.{extra} needs {framework}, which is not installed: "
                       f"pip install 'elastic[{extra}]' ({exc})")


@dataclass
class Due:
    """A daemon request that fell due at a step boundary: this step's save answers it."""

    op: WorkerOp  # checkpoint or drain
    step: int
    request_id: str | None


def path_bytes(path: str) -> int:
    """Size of a checkpoint file, or of every file under a checkpoint folder."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


class ElasticCore:
    """One per callback: the shim session (opened lazily: a callback may be pickled), the step and the due request.

    Every rank calls it at the same step boundaries, so every rank takes a request at the same agreed step and
    the framework's collective save runs everywhere at once.
    """

    def __init__(self, session: Session | NullSession | None = None) -> None:
        self._session = session  # None: trainer_shim.init() at first use
        self._step: int | None = None  # the last step boundary seen; None before training starts
        self._samples = 0  # this rank's samples since the last boundary (micro-batches of one step add up)
        self._step_ended = time.perf_counter()  # a save's duration counts from the end of the step it follows
        self.due: Due | None = None  # the request this step's save answers
        self.drain: Due | None = None  # set once a drain stopped training; `drained` goes out at training end

    @property
    def session(self) -> Session | NullSession:
        if self._session is None:
            self._session = trainer_shim.init()
        return self._session

    @property
    def enabled(self) -> bool:
        """True under elasticd; elsewhere the callback only passes steps to a quiet no-op session."""
        return self.session.enabled

    def begin(self, step: int) -> None:
        """Training starts (or resumes) at this completed step."""
        self._step, self._samples, self.drain = step, 0, None

    def on_batch(self, step: int, samples: int, loss: Callable[[], float | None]) -> Due | None:
        """After each batch: at a new optimizer step, report it and take a request due there.

        `loss` is called only at a step boundary: turning a GPU tensor into a float waits for the device.
        """
        self._samples += samples
        if step == self._step:
            return None  # mid gradient accumulation: ranks agree on optimizer steps, not micro-batches
        self._step, self._step_ended = step, time.perf_counter()
        session = self.session
        session.report(step, loss=loss(), samples=self._samples)
        self._samples = 0
        if session.should_stop(step):
            self.due = self.drain = Due(WorkerOp.drain, step, session.last_request_id)
        elif session.should_checkpoint(step):
            self.due = Due(WorkerOp.checkpoint, step, session.last_request_id)
        return self.due

    def saved(self, step: int, path: str, writer: bool) -> None:
        """A save at `step` is on disk: the writing rank reports it, answering the due request if any."""
        due, self.due = self.due, None
        if writer:
            request_id = due.request_id if due is not None and due.step == step else None
            self.session.report_checkpoint(step, path, path_bytes(path), time.perf_counter() - self._step_ended,
                                           request_id)

    def end(self) -> None:
        """Training ended: after a drain, every rank says drained once rank 0's save is durable everywhere."""
        if self.drain is not None:
            if dist.is_available() and dist.is_initialized():
                dist.barrier()  # the writer may still be finishing: nobody says drained before it is done
            self.session.drained(self.drain.step, self.drain.request_id)
        self.session.close()
        self._session = None
