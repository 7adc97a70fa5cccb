"""Typed message bodies: a frozen record per body, checked field by field once, where the frame arrives."""

from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from elasticd.wire.protocol import ErrorCode, ProtocolError

MAX_INT = 2**63  # decode refuses larger JSON numbers already; a record says which field held one
MAX_TEXT = 64 * 1024  # characters in one text field: a mesh frame may hold 64 MB, no name or reason needs that
Check = Callable[[Any, str, str], Any]  # (value, the op, the field's path in its body)
R = TypeVar("R", bound="Record")


class Record:
    """A message body's fields, each of its declared type; `decode` refuses any other body with the field named.

    A record is a frozen dataclass, or a frozen `msgspec.Struct` (`class X(Struct, Record, frozen=True)`) for the
    few that a coordinator takes thousands of a round: msgspec builds a Struct in a third of a dataclass's time.
    """

    __slots__ = ()  # a Struct record keeps its own slots; a dataclass record has its __dict__

    @classmethod
    def decode(cls: type[R], body: object, what: str = "", size: int | None = None) -> R:
        """The record of `body`; ProtocolError(bad_message) naming the field when a field is missing or mistyped.

        Fields the record does not declare are ignored: a newer peer may send more (docs/protocol.md, "Versions").
        `size`: the bytes of the frame the body came in (`Envelope.size`). A frame of at most MAX_TEXT bytes holds
        no longer text, and its numbers were bounded as it was parsed, so msgspec checks the types in one pass
        in C; the field-by-field checks below take the rest (a body built in process, a larger frame).
        """
        decoder = _DECODERS.get((cls, what))
        if decoder is None:  # `what`: an op's or a verb's name, a bounded set
            decoder = _DECODERS[cls, what] = cls.decoder(what)
        return decoder(body, size)

    @classmethod
    def decoder(cls: type[R], what: str = "") -> Callable[[object, int | None], R]:
        """`decode` for one op, with what it looks up found once: the coordinator's inbox decodes thousands of
        frames a round at 2,048 nodes."""
        op = what or cls.__name__
        spec = _SPECS.get(cls) or _spec(cls)
        convert, whole, settles, consistent = msgspec.convert, spec.whole, spec.settles, spec.consistent

        def decode(body: object, size: int | None = None) -> R:
            if not whole or size is None or size > MAX_TEXT:
                return cls._decode(body, op, "")
            try:
                record = convert(body, cls)
            except msgspec.ValidationError as err:
                raise bad(op, _said(str(err))) from None
            if settles:
                cls._settled(record, body)  # type: ignore[arg-type]  # a dict: msgspec took it as this record
            if consistent or not (why := record.inconsistency()):
                return record
            raise bad(op, why)
        return decode

    @classmethod
    def _decode(cls: type[R], body: object, op: str, path: str) -> R:
        if not isinstance(body, dict):
            raise bad(op, f"{f'field {path!r}' if path else 'body'} must be an object, got {_kind(body)}")
        spec = _SPECS.get(cls) or _spec(cls)
        # The fields set as the dataclass's __init__ would set them, without its frozen setattr per field; a Struct's
        # are gathered and given to its __init__, which sets its defaults.
        record = None if spec.struct else object.__new__(cls)
        fields = {} if record is None else record.__dict__
        fields.update(spec.defaults)
        for name, value in body.items():
            check = spec.checks.get(name)
            if check is not None:
                fields[name] = check(value, op, f"{path}.{name}" if path else name)
        if not spec.required <= fields.keys():
            missing = next(name for name in spec.checks if name in spec.required and name not in fields)
            raise bad(op, f"field '{path + '.' if path else ''}{missing}' is missing")
        for name, factory in spec.factories:
            if name not in fields:
                fields[name] = factory()
        if record is None:
            record = cls(**fields)
        if spec.consistent or not (why := record.inconsistency()):
            return record
        raise bad(op, why)

    @classmethod
    def _settled(cls, record: Any, body: dict[str, Any]) -> None:
        """After msgspec built `record` from `body`: what this class's own `_decode` adds (nothing here). A record
        with a `_decode` of its own takes msgspec's pass only with this too, and so does any record holding it."""

    def inconsistency(self) -> str:
        """Why fields that are each well typed do not make a message together ("" when they do)."""
        return ""

    def encode(self) -> dict[str, Any]:
        """The body as sent: every field, records within it as objects, enums as their values."""
        values = fields_of(self)
        if _is_plain(type(self)):  # JSON types only (a round's 2,048 copies): the fields as they are
            return values
        return {name: _plain(value) for name, value in values.items()}


def fields_of(record: Record) -> dict[str, Any]:
    """A record's fields by name, a new dict (a Struct has no `vars`)."""
    return msgspec.structs.asdict(record) if isinstance(record, msgspec.Struct) else dict(vars(record))


def field_names(cls: type[Record]) -> list[str]:
    """A record class's fields, in declaration order."""
    if issubclass(cls, msgspec.Struct):
        return list(cls.__struct_fields__)
    return [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]


def required_fields(cls: type[Record]) -> list[str]:
    """The fields a body of `cls` must have (no default), in declaration order."""
    required = (_SPECS.get(cls) or _spec(cls)).required
    return [name for name in field_names(cls) if name in required]


def bad(where: str, why: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_MESSAGE, f"{where}: {why}")


_AS_IS = frozenset({str, int, float, bool, type(None)})
_PLAIN: dict[type, bool] = {}


def _is_plain(cls: type[Record]) -> bool:
    """Whether every field is a JSON type (str, numbers, bool, null, lists, dicts and TypedDicts of them): encoded as
    it is."""
    if cls not in _PLAIN:
        def plain(hint: Any) -> bool:
            args = typing.get_args(hint)
            if hint in _AS_IS or hint is Any:
                return True
            if typing.is_typeddict(hint):  # a dict at run time: plain when its values are (a node in `status`)
                return all(plain(h) for h in typing.get_type_hints(hint).values())
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


@dataclasses.dataclass(frozen=True)
class _Spec:
    """How a record class decodes, worked out once: each field's check (in declaration order), the fields that
    must be there, the others' defaults, and whether the class checks its fields together."""

    checks: dict[str, Check]
    required: frozenset[str]
    defaults: dict[str, object]
    factories: tuple[tuple[str, Callable[[], object]], ...]
    consistent: bool  # no `inconsistency` of its own
    whole: bool  # msgspec decodes it as these checks would: no record within checks itself its own way
    settles: bool  # it adds to what msgspec built (`_settled`)
    struct: bool  # a msgspec.Struct: built by its __init__


_SPECS: dict[type, _Spec] = {}
_DECODERS: dict[tuple[type, str], Callable[[object, int | None], Any]] = {}


def _spec(cls: type[Record]) -> _Spec:
    hints = typing.get_type_hints(cls)
    struct = issubclass(cls, msgspec.Struct)
    if struct:  # its __init__ sets the defaults: only which fields must be there is needed here
        info = msgspec.structs.fields(cls)  # type: ignore[arg-type]
        names, required = [f.name for f in info], frozenset(f.name for f in info if f.required)
        defaults: dict[str, object] = {}
        factories: tuple[tuple[str, Callable[[], object]], ...] = ()
    else:
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        names = [f.name for f in fields]
        required = frozenset(f.name for f in fields if f.default is dataclasses.MISSING
                             and f.default_factory is dataclasses.MISSING)
        defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
        factories = tuple((f.name, f.default_factory) for f in fields
                          if f.default_factory is not dataclasses.MISSING)
    _SPECS[cls] = spec = _Spec({name: _check_of(hints[name]) for name in names}, required, defaults, factories,
                               cls.inconsistency is Record.inconsistency, _whole(cls), _own(cls, "_settled"), struct)
    return spec


def _whole(cls: type[Record]) -> bool:
    """Whether msgspec takes the record, and every record inside it decodes and checks as a plain one."""
    try:
        msgspec.inspect.type_info(cls)
    except TypeError:
        return False
    inner = [h for hint in typing.get_type_hints(cls).values() for h in _records_in(hint)]
    settles = _own(cls, "_settled")
    return (settles or not _own(cls, "_decode")) and all(
        (settles or not _own(r, "_settled")) and r.inconsistency is Record.inconsistency and _whole(r) for r in inner)


def _own(cls: type[Record], method: str) -> bool:
    """Whether the class decodes its own way (overrides Record's `_decode` or `_settled`)."""
    return getattr(cls, method).__func__ is not getattr(Record, method).__func__


def _records_in(hint: Any) -> list[type[Record]]:
    if isinstance(hint, type) and issubclass(hint, Record):
        return [hint]
    return [r for arg in typing.get_args(hint) for r in _records_in(arg)]


_EXPECTED = re.compile(r"Expected `(.+)`, got `(.+)`")
_MISSING = re.compile(r"Object missing required field `(.+)`")


def _said(error: str) -> str:
    """msgspec's reason in this module's words: "field 'ranks[0]' must be int, got str"."""
    text, _, where = error.partition(" - at `$")
    path = where.rstrip("`").lstrip(".")
    if missing := _MISSING.fullmatch(text):
        return f"field '{path + '.' if path else ''}{missing[1]}' is missing"
    if expected := _EXPECTED.fullmatch(text):
        wanted, got = expected[1].replace(" | ", " or "), expected[2]
        return f"{f'field {path!r}' if path else 'body'} must be {wanted}, got {got}"
    return f"field '{path}': {text[:1].lower()}{text[1:]}" if path else text


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
        return _list_of(_check_of(args[0]), _scalars(args[0]))
    if origin is dict:
        return _dict_of(_check_of(args[1]), _scalars(args[1]))
    if isinstance(hint, type) and issubclass(hint, Record):
        return lambda value, op, path: hint._decode(value, op, path)
    if typing.is_typeddict(hint):
        return _typed_dict(hint, hint.__required_keys__)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return lambda value, op, path: _enum(hint, value, op, path)
    if hint is bool:
        return _bool
    if hint is int:
        return _int
    if hint is float:
        return _float
    if hint is str:
        return _str
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


# A list or an object is kept when each item checks as it is (nearly always: no copy of what a body holds); one
# with an item that does not (an int where a float is declared) is a copy of the checked items. An item that is a
# scalar of an exact type it takes passes at once.
def _list_of(item: Check, kinds: frozenset[type]) -> Check:
    def check(value: object, op: str, path: str) -> object:
        items = _typed(value, list, op, path)
        for i, v in enumerate(items):
            if not (kinds and _as_is(v, kinds)) and item(v, op, f"{path}[{i}]") is not v:
                return [item(v, op, f"{path}[{i}]") for i, v in enumerate(items)]
        return items
    return check


def _dict_of(item: Check, kinds: frozenset[type]) -> Check:
    def check(value: object, op: str, path: str) -> object:
        items = _typed(value, dict, op, path)
        for k, v in items.items():
            if type(k) is not str or (not (kinds and _as_is(v, kinds)) and item(v, op, f"{path}.{k}") is not v):
                return {str(k): item(v, op, f"{path}.{k}") for k, v in items.items()}
        return items
    return check


def _as_is(value: object, kinds: frozenset[type]) -> bool:
    kind = type(value)
    return kind in kinds and (kind is not int or -MAX_INT <= value <= MAX_INT)  # type: ignore[operator]


def _typed_dict(hint: type, required: frozenset[str]) -> Check:
    """A TypedDict: each key it declares checked where present, the required ones there; the dict is kept as sent
    (with any key it does not declare), for what passes it on as it is. A scalar of an exact type its key takes
    passes at once: a rank's report rides on most heartbeats."""
    hints = typing.get_type_hints(hint)
    checks = {name: _check_of(kind) for name, kind in hints.items()}
    exact = {name: _scalars(kind) for name, kind in hints.items()}

    def check(value: object, op: str, path: str) -> object:
        body = _typed(value, dict, op, path)
        for key, item in body.items():
            kinds = exact.get(key)  # _as_is inline: a call per key costs a third more
            if kinds is not None and not ((kind := type(item)) in kinds
                                          and (kind is not int or -MAX_INT <= item <= MAX_INT)
                                          and (kind is not str or len(item) <= MAX_TEXT)):
                checks[key](item, op, f"{path}.{key}")  # a list, an object, or a wrong type: looked into
        if required and not required <= body.keys():
            raise bad(op, f"field '{path}.{min(required - body.keys())}' is missing")
        return body
    return check


def _scalars(hint: object) -> frozenset[type]:
    """The JSON types a value of `hint` is as it is (str, int, float, bool, null); none for a list, an object."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        each = [_scalars(a) for a in typing.get_args(hint)]
        return frozenset().union(*each) if all(each) else frozenset()
    return frozenset({hint}) if isinstance(hint, type) and hint in _AS_IS else frozenset()


# The scalars: the exact JSON type at once (nearly every value), else the general check, which names the field.
def _str(value: object, op: str, path: str) -> str:
    text: str = value if type(value) is str else _typed(value, str, op, path)
    if len(text) > MAX_TEXT:
        raise bad(op, f"field '{path}' holds {len(text)} characters, more than {MAX_TEXT}")
    return text


def _bool(value: object, op: str, path: str) -> bool:
    return value if value is True or value is False else _typed(value, bool, op, path)


def _int(value: Any, op: str, path: str) -> int:
    if type(value) is int and -MAX_INT <= value <= MAX_INT:
        return value
    number = _typed(value, int, op, path)
    if not -MAX_INT <= number <= MAX_INT:
        raise bad(op, f"field '{path}' is out of range")
    return int(number)


def _float(value: Any, op: str, path: str) -> float:
    if type(value) is float:
        return value
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
