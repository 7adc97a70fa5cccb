"""docs/protocol.md is complete enough to script against from another language."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from elasticd.wire.assignment import TO_MEMBER
from elasticd.wire.member_reports import TO_COORDINATOR
from elasticd.wire.member_state import STATE_REPORTS
from elasticd.wire.names import EventKind, MeshOp, WorkerOp
from elasticd.wire.protocol import ErrorCode
from elasticd.wire.worker_reports import IN_ROUND

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


@pytest.mark.parametrize(("section", "records"), [("### 9.1", TO_COORDINATOR), ("### 9.1", STATE_REPORTS),
                                                   ("### 9.2", TO_MEMBER)])
def test_every_field_of_a_typed_mesh_op_is_in_its_row(section: str, records: dict[str, type[Any]]) -> None:
    """§9.1's and §9.2's tables name each field of each op's record (elasticd/wire/): the doc is the record."""
    start = DOC.index(section)
    table = DOC[start:DOC.index("\n### ", start + 1)]
    rows = {line.split("|")[1].strip(" `"): line for line in table.splitlines() if line.startswith("| `")}
    missing = [(op, f.name) for op, record in records.items() for f in dataclasses.fields(record)
               if f"`{f.name}`" not in rows[op]]
    assert missing == []


def test_every_field_of_a_typed_worker_report_is_in_its_worker_channel_row() -> None:
    lines = (DOCS / "worker-channel.md").read_text().splitlines()
    rows = {op: next(line for line in lines if line.startswith(f"| `{op}` |")) for op in IN_ROUND}
    assert [(op, f.name) for op, record in IN_ROUND.items() for f in dataclasses.fields(record)
            if f"`{f.name}`" not in rows[op]] == []
