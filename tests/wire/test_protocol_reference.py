"""docs/protocol.md is complete enough to script against from another language."""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticd.commands.registry import REGISTRY
from elasticd.wire.assignment import TO_MEMBER
from elasticd.wire.member_reports import TO_COORDINATOR
from elasticd.wire.member_state import STATE_REPORTS, RankReport, WorkerInfo
from elasticd.wire.names import EventKind, MeshOp, WorkerOp
from elasticd.wire.protocol import ErrorCode
from elasticd.wire.record import Record
from elasticd.wire.record import field_names as record_fields
from elasticd.wire.telemetry import StepRow, StepTelemetry
from elasticd.wire.worker_reports import FROM_WORKER
from elasticd.wire.worker_requests import TO_WORKER

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
    missing = [(op, name) for op, record in records.items() for name in record_fields(record)
               if f"`{name}`" not in rows[op]]
    assert missing == []


def field_names(record: type[Record]) -> Iterator[str]:
    """A record's fields, and those of the records within it (`joined`'s `heal`)."""
    hints = typing.get_type_hints(record)
    for name in record_fields(record):
        yield name
        for inner in typing.get_args(hints[name]) or (hints[name],):
            if isinstance(inner, type) and issubclass(inner, Record):
                yield from field_names(inner)


@pytest.mark.parametrize(("table", "records"), [("Worker → daemon", FROM_WORKER), ("Daemon → worker", TO_WORKER)])
def test_every_field_of_a_typed_worker_report_is_in_its_worker_channel_row(
        table: str, records: dict[str, type[Record]]) -> None:
    """Both tables of worker-channel.md name each field of each op's record (`checkpoint` is in both, apart)."""
    doc = (DOCS / "worker-channel.md").read_text()
    start = doc.index(f"\n{table}")
    lines = doc[start:doc.index("\n\n", doc.index("|---", start))].splitlines()
    rows = {line.split("|")[1].strip(" `"): line for line in lines if line.startswith("| `")}
    assert set(rows) == set(records)
    assert [(op, name) for op, record in records.items() for name in field_names(record)
            if f"`{name}`" not in rows[op]] == []


def test_the_step_telemetry_example_shows_every_field_of_its_record() -> None:
    """§6.3's example is what a daemon publishes: every StepRow field, and it decodes."""
    section = DOC[DOC.index("### 6.3"):DOC.index("### 6.4")]
    example = section[section.index('"body":'):section.index(", …]}}")] + "]}"
    steps = StepTelemetry.decode(json.loads(example.removeprefix('"body":')), "steps")
    assert steps.round == 3 and [f.name for f in dataclasses.fields(StepRow) if f'"{f.name}"' not in section] == []


def reply_fields(hint: Any, elsewhere: tuple[type, ...] = ()) -> Iterator[str]:
    """The names in a reply: a record's fields, a TypedDict's keys, and those of the records and TypedDicts within
    (not within those `elsewhere`: another section's rows)."""
    if hint in elsewhere:
        return
    if isinstance(hint, type) and (issubclass(hint, Record) or typing.is_typeddict(hint)):
        for name, inner in typing.get_type_hints(hint).items():
            yield name
            yield from reply_fields(inner, elsewhere)
    for arg in typing.get_args(hint):
        yield from reply_fields(arg, elsewhere)


ELSEWHERE = {"status": (WorkerInfo, RankReport)}  # a node's `workers` are `workers`' rows, its `metrics` §9.1's (hb)


@pytest.mark.parametrize("verb", [name for name, command in REGISTRY.items() if command.reply is not None])
def test_every_field_of_a_typed_reply_is_named_in_its_verbs_section(verb: str) -> None:
    """§5's section of each verb with a reply record names every field in it, nested rows' too (`ok`: §4)."""
    start = DOC.index(f"\n### {verb}\n")
    section = DOC[start:DOC.index("\n### ", start + 1)]
    names = reply_fields(REGISTRY[verb].reply, ELSEWHERE.get(verb, ()))
    assert [name for name in names if name != "ok" and not re.search(rf"\b{name}\b", section)] == []
