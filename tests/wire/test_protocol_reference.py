"""docs/protocol.md is complete enough to script against from another language."""

from __future__ import annotations

from pathlib import Path

import pytest

from elasticd.wire.names import EventKind, MeshOp, WorkerOp
from elasticd.wire.protocol import ErrorCode

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

DOCS = Path(__file__).resolve().parents[2] / "docs"
DOC = (DOCS / "protocol.md").read_text()


def test_every_mesh_op_is_documented() -> None:
    assert [op for op in MeshOp if f"| `{op}` |" not in DOC] == []


def test_every_event_kind_is_documented() -> None:
    assert [kind for kind in EventKind if f"`{kind}`" not in DOC] == []


def test_every_error_code_is_documented() -> None:
    assert [(n, c) for n, c in ErrorCode.NAMES.items() if f"| {n} | `{c}` |" not in DOC] == []


def test_every_worker_op_is_documented() -> None:
    doc = (DOCS / "worker-channel.md").read_text()
    assert [op for op in WorkerOp if f"| `{op}` |" not in doc] == []
