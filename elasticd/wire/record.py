"""Typed message bodies: a frozen dataclass per body, checked field by field once, where the frame arrives."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from elasticd.wire.protocol import ErrorCode, ProtocolError

MAX_INT = 2**63  # decode refuses larger JSON numbers already; a record says which field held one
MAX_TEXT = 64 * 1024  # characters in one text field: a mesh frame may hold 64 MB, no name or reason needs that
Check = Callable[[Any, str, str], Any]  # (value, the op, the field's path in its body)
R = TypeVar("R", bound="Record")


class Record:
    """A message body's fields, each of its declared type; `decode` refuses any other body with the field named."""

    @classmethod
    def decode(cls: type[R], body: object, what: str = "") -> R:
        """The record of `body`; ProtocolError(bad_message) naming the field when a field is missing or mistyped.

        Fields the record does not declare are ignored: a newer peer may send more (docs/protocol.md, "Versions").
        """
        return cls._decode(body, what or cls.__name__, "")

    @classmethod
    def _decode(cls: type[R], body: object, op: str, path: str) -> R:
        if not isinstance(body, dict):
            raise bad(op, f"{f'field {path!r}' if path else 'body'} must be an object, got {_kind(body)}")
        values = {}
        for name, (check, required) in _fields(cls).items():
            if name in body:
                values[name] = check(body[name], op, f"{path}.{name}" if path else name)
            elif required:
                raise bad(op, f"field '{path + '.' if path else ''}{name}' is missing")
        record = cls(**values)
        if why := record.inconsistency():
            raise bad(op, why)
        return record

    def inconsistency(self) -> str:
        """Why fields that are each well typed do not make a message together ("" when they do)."""
        return ""

    def encode(self) -> dict[str, Any]:
        """The body as sent: every field, records within it as objects, enums as their values."""
        if _is_plain(type(self)):  # JSON types only (a round's 2,048 copies): the fields as they are
            return dict(vars(self))
        return {name: _plain(value) for name, value in vars(self).items()}


def bad(where: str, why: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_MESSAGE, f"{where}: {why}")


_AS_IS = frozenset({str, int, float, bool, type(None)})
_PLAIN: dict[type, bool] = {}


def _is_plain(cls: type[Record]) -> bool:
    """Whether every field is a JSON type (str, numbers, bool, null, lists and dicts of them): encoded as it is."""
    if cls not in _PLAIN:
        def plain(hint: Any) -> bool:
            args = typing.get_args(hint)
            if hint in _AS_IS or hint is Any:
                return True
            return typing.get_origin(hint) in (list, dict, types.UnionType, typing.Union) and all(map(plain, args))
        _PLAIN[cls] = all(plain(hint) for hint in typing.get_type_hints(cls).values())
    return _PLAIN[cls]


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind in _AS_IS or isinstance(value, str):  # a StrEnum is its string on the wire
        return value
    if kind is list or kind is tuple:
        return [v if type(v) in _AS_IS else _plain(v) for v in value]
    if kind is dict:
        return {k: v if type(v) in _AS_IS else _plain(v) for k, v in value.items()}
    if isinstance(value, Record):
        return value.encode()
    if isinstance(value, enum.Enum):
        return value.value
    return value


_FIELDS: dict[type, dict[str, tuple[Check, bool]]] = {}


def _fields(cls: type[Record]) -> dict[str, tuple[Check, bool]]:
    """Each field's check and whether it must be there; worked out once per record class."""
    if cls not in _FIELDS:
        hints = typing.get_type_hints(cls)
        _FIELDS[cls] = {f.name: (_check_of(hints[f.name]), f.default is dataclasses.MISSING
                                 and f.default_factory is dataclasses.MISSING)
                        for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return _FIELDS[cls]


def _check_of(hint: Any) -> Check:  # one branch per kind of type a body may declare
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return lambda value, _op, _path: value
    if origin in (types.UnionType, typing.Union):
        present = [a for a in args if a is not type(None)]
        if len(present) == 1:  # X | None: a value that is there is checked as X, and its own error said
            inner = _check_of(present[0])
            return lambda value, op, path: None if value is None else inner(value, op, path)
        return _union([_check_of(a) for a in args], " or ".join(_name(a) for a in args))
    if origin is list:
        item = _check_of(args[0])
        return lambda value, op, path: [item(v, op, f"{path}[{i}]")
                                        for i, v in enumerate(_typed(value, list, op, path))]
    if origin is dict:
        item = _check_of(args[1])
        return lambda value, op, path: {str(k): item(v, op, f"{path}.{k}")
                                        for k, v in _typed(value, dict, op, path).items()}
    if isinstance(hint, type) and issubclass(hint, Record):
        return lambda value, op, path: hint._decode(value, op, path)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return lambda value, op, path: _enum(hint, value, op, path)
    if hint is bool:
        return lambda value, op, path: _typed(value, bool, op, path)
    if hint is int:
        return _int
    if hint is float:
        return _float
    if hint is str:
        return _text
    if hint is type(None):
        return lambda value, op, path: _typed(value, type(None), op, path)
    raise TypeError(f"a record field of type {hint!r} cannot be checked")


def _name(hint: Any) -> str:
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _union(checks: list[Check], names: str) -> Check:
    def check(value: Any, op: str, path: str) -> Any:
        for one in checks:
            try:
                return one(value, op, path)
            except ProtocolError:
                continue
        raise bad(op, f"field '{path}' must be {names}, got {_kind(value)}")
    return check


def _typed(value: Any, kind: type, op: str, path: str) -> Any:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise bad(op, f"field '{path}' must be {_name(kind)}, got {_kind(value)}")
    return value


def _int(value: Any, op: str, path: str) -> int:
    number = _typed(value, int, op, path)
    if not -MAX_INT <= number <= MAX_INT:
        raise bad(op, f"field '{path}' is out of range")
    return int(number)


def _text(value: Any, op: str, path: str) -> str:
    text: str = _typed(value, str, op, path)
    if len(text) > MAX_TEXT:
        raise bad(op, f"field '{path}' holds {len(text)} characters, more than {MAX_TEXT}")
    return text


def _float(value: Any, op: str, path: str) -> float:
    if isinstance(value, int) and not isinstance(value, bool):
        return float(_int(value, op, path))
    return float(_typed(value, float, op, path))


def _enum(kind: type[enum.Enum], value: Any, op: str, path: str) -> enum.Enum:
    try:
        return kind(value)
    except ValueError:
        raise bad(op, f"field '{path}' must be one of {', '.join(str(m.value) for m in kind)}, "
                  f"got {value!r}") from None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
