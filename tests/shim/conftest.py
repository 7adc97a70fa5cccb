"""What the shim's process-group tests share: the job's long-lived store, without a daemon."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist


@pytest.fixture
def store_addr() -> Iterator[str]:
    """The job's long-lived store, as the coordinator's daemon hosts it; the members get its address."""
    server = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    yield f"127.0.0.1:{server.port}"
    del server
