"""Malformed bodies of each kind for a typed record, worked out from its fields: a declared op is fuzzed too."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Iterator
from typing import Any

import pytest

from elasticd.wire.protocol import Envelope, ErrorCode, ProtocolError, decode, encode
from elasticd.wire.record import Record, field_names, required_fields

# One of each JSON type: a field's wrong value is the first its check refuses (none for a field typed Any).
OTHERS: tuple[Any, ...] = (7, "7", 7.5, True, [7], {"z": 7})
HUGE_INT = 2**64  # past the 2**63 any field or frame takes
HUGE_TEXT = "x" * 300_000  # past the 256 KB a daemon reads in one frame


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str  # missing, wrong_type, huge, extra
    field: str
    body: dict[str, Any]


def example(hint: Any) -> Any:
    """A value of the declared type (the smallest that makes sense)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return example(next(a for a in args if a is not type(None)))
    if origin is list:
        return []
    if origin is dict or hint is Any:
        return {}
    if isinstance(hint, type) and issubclass(hint, Record):
        return valid(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return next(iter(hint)).value
    return {bool: True, int: 1, float: 1.5, str: "s"}[hint]


def valid(record: type[Record]) -> dict[str, Any]:
    """A body the record takes: every field, each an example of its type."""
    hints = typing.get_type_hints(record)
    return {name: example(hints[name]) for name in field_names(record)}


def required(record: type[Record]) -> list[str]:
    """The fields a body must have (no default)."""
    return required_fields(record)


def refused(record: type[Record], op: str, body: object, errno: int = ErrorCode.BAD_MESSAGE) -> str:
    """The reason `record` refuses `body` with: `errno`, and the op named first. The body is refused the same way
    when it arrives in a frame (a small one is checked by msgspec), unless the frame itself is refused first."""
    with pytest.raises(ProtocolError) as caught:
        record.decode(body, op)
    assert caught.value.errno == errno and caught.value.reason.startswith(f"{op}: "), caught.value.reason
    env = framed(op, body)
    if env is not None:
        with pytest.raises(ProtocolError) as in_frame:
            record.decode(env.body, op, env.size)
        assert in_frame.value.errno == errno and in_frame.value.reason.startswith(f"{op}: "), in_frame.value.reason
    return caught.value.reason


def refuses(record: type[Record], body: dict[str, Any]) -> bool:
    """Whether `record` refuses `body`, built in process and arriving in a frame alike."""
    verdict = _refused(record, body, None)
    env = framed("probe", body)
    if env is not None:
        assert _refused(record, env.body, env.size) == verdict, \
            f"refused in process but not in a frame, or the reverse: {body}"
    return verdict


def _refused(record: type[Record], body: object, size: int | None) -> bool:
    try:
        record.decode(body, "probe", size)
    except ProtocolError:
        return True
    return False


def framed(op: str, body: object) -> Envelope | None:
    """The envelope a daemon reads when `body` comes in a frame; None when the frame itself is refused."""
    try:
        return decode(encode(Envelope("req", op, body)))  # type: ignore[arg-type]
    except (ProtocolError, TypeError, ValueError):
        return None


def cases(record: type[Record]) -> Iterator[Case]:
    """Each kind of malformed body: a required field left out, each field of a wrong type, each number or text
    too big, and a field the record does not declare (taken and ignored: a newer peer may send more)."""
    good = valid(record)
    hints = typing.get_type_hints(record)
    for name in field_names(record):
        if name in required(record):
            yield Case("missing", name, {k: v for k, v in good.items() if k != name})
        wrong = next((v for v in OTHERS if refuses(record, {**good, name: v})), None)
        if wrong is not None:
            yield Case("wrong_type", name, {**good, name: wrong})
        kinds = set(typing.get_args(hints[name])) | {hints[name]}
        if kinds & {int, float}:
            yield Case("huge", name, {**good, name: HUGE_INT})
        elif str in kinds:
            yield Case("huge", name, {**good, name: HUGE_TEXT})
    yield Case("extra", "zz_from_a_newer_peer", {**good, "zz_from_a_newer_peer": [1, {"a": None}]})
