"""The wire protocol: a versioned JSON envelope shared by daemons, clients and the trainer shim.

Stdlib only: `trainer_shim` imports this module, and it must stay free of elasticd's other imports.
docs/protocol.md is the reference for everything defined here.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 256 * 1024  # the cap on a request a daemon accepts
MAX_DEPTH = 32  # nesting of objects and lists; deeper is refused before anything recurses over it
MAX_REPLY_BYTES = 64 * 1024 * 1024  # replies and events a client accepts (status of a large job, event history)
MESSAGE_TYPES = ("req", "rep", "ev", "hb", "st")
# A JSON value, as json.loads returns it and json.dumps takes it: for what stays JSON (an event's fields, a body on
# its way to the encoder). Its containers are read-only, so a list[str] or a dict[str, float] is one as it is; a
# reader narrows with isinstance (a str is a Sequence too: test for list, not Sequence).
Json = str | int | float | bool | None | Sequence["Json"] | Mapping[str, "Json"]
JsonObject = dict[str, Json]


class ErrorCode:
    """Stable error numbers (Circus-style); the names travel with them as `code`."""

    INVALID_JSON = 1
    BAD_MESSAGE = 2
    UNKNOWN_OP = 3
    BAD_ARGUMENT = 4
    REFUSED = 5  # an interlock; `--force` overrides
    NOT_RUNNING = 6
    UNAUTHORIZED = 7
    TIMEOUT = 8
    INTERNAL = 9
    NOT_FOUND = 10
    VERSION = 11
    DUPLICATE_NODE = 12  # a mesh `register` refused: a live daemon of another instance holds that node id

    NAMES = {
        1: "invalid_json",
        2: "bad_message",
        3: "unknown_op",
        4: "bad_argument",
        5: "refused",
        6: "not_running",
        7: "unauthorized",
        8: "timeout",
        9: "internal",
        10: "not_found",
        11: "version",
        12: "duplicate_node",
    }


class ProtocolError(Exception):
    """A frame or request that cannot be served; carries the stable error number."""

    def __init__(self, errno: int, reason: str) -> None:
        super().__init__(reason)
        self.errno = errno
        self.reason = reason

    def as_body(self) -> JsonObject:
        return {
            "ok": False,
            "errno": self.errno,
            "code": ErrorCode.NAMES.get(self.errno, "error"),
            "reason": self.reason,
        }


@dataclass
class Envelope:
    """One message on any elastic socket."""

    type: str
    op: str
    body: dict[str, Any] = field(default_factory=dict)  # Any: handlers index it before a record or `arg` checks a value
    id: str = ""
    node: str = ""
    seq: int = 0
    ts: float = 0.0
    v: int = PROTOCOL_VERSION
    size: int | None = None  # the frame's bytes where one was parsed: its body's records check it in one pass

    def to_dict(self) -> JsonObject:
        return {
            "v": self.v,
            "type": self.type,
            "op": self.op,
            "id": self.id,
            "node": self.node,
            "seq": self.seq,
            "ts": self.ts or time.time(),
            "body": self.body,
        }


def new_id() -> str:
    return uuid.uuid4().hex[:16]


def _finite(value: Json) -> Json:
    """JSON has no NaN/Infinity; a NaN loss is sent as null rather than as invalid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number this protocol accepts")


def _finite_float(text: str) -> float:
    """1e400 parses as infinity, which int() and float() arithmetic downstream cannot take: refuse it here."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(value := int(text)) >= 2**63:
        raise ValueError(f"integer {text[:20]} is out of range")
    return value


_text = json.encoder.encode_basestring_ascii  # a JSON string literal, in C, exactly as the encoder writes one
# %r of a (finite) float is how json writes it; `to_dict`'s key order, so a frame's bytes do not change.
_ENVELOPE = '{"v":%d,"type":%s,"op":%s,"id":%s,"node":%s,"seq":%d,"ts":%r,"body":%s}'
# Built once: json.loads/dumps with options build a decoder or an encoder per call, a third of the work.
_STRICT = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int)
# The number hooks cost a Python call per number (a third of a heartbeat's decoding at 2,048 nodes). A frame
# with no run of 19 digits and no 3-digit exponent holds no integer past 2**63 and no float that overflows,
# so json's C parser alone decodes it; any other frame takes the hooks (a string of digits only costs time).
_FAST = json.JSONDecoder(parse_constant=_no_constant)
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# The check is two C passes: digits become 0, e/E e, signs s, the rest blanks; then three substring searches.
_SHAPES = bytes(ord("0") if chr(b).isdigit() and b < 128 else ord("e") if b in b"eE" else ord("s") if b in b"+-"
                else ord(" ") for b in range(256))


# A node's instance id is hex ("…9e019d…"): a 3-digit exponent only counts where a number ends after it.
_BIG_EXPONENT = re.compile(rb"[0-9][eE][+-]?[0-9]{3,}(?:[,}\]\s]|$)")


def _may_overflow(utf8: bytes) -> bool:
    shapes = utf8.translate(_SHAPES)
    return b"0" * 19 in shapes or ((b"e000" in shapes or b"es000" in shapes) and bool(_BIG_EXPONENT.search(utf8)))


def _depth(value: Json) -> int:
    """Nesting depth, without recursion (a hostile frame must not reach the recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:
                stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def encode(env: Envelope) -> bytes:
    """The envelope around its body, assembled as text: only the body goes through the encoder (a third less work
    than encoding `to_dict()`, for the same bytes)."""
    try:  # nearly every frame has no NaN: walking each one for it cost more than the JSON itself at scale
        body = _ENCODER.encode(env.body)
    except ValueError:
        body = _ENCODER.encode(_finite(env.body))
    return (_ENVELOPE % (env.v, _text(env.type), _text(env.op), _text(env.id), _text(env.node), env.seq,
                         env.ts or time.time(), body)).encode()


def _parse(frame: bytes, from_daemon: bool) -> Json:
    """The frame's JSON: a request's strictly (no NaN, numbers in range), a daemon's reply (`from_daemon`) as is."""
    try:
        # JSON that starts with `{` and no NUL after it is UTF-8 (what json.detect_encoding, in Python, would find)
        utf8_object = isinstance(frame, bytes) and frame[:1] == b"{" and frame[1:2] != b"\0"
        encoding = "utf-8" if utf8_object else json.detect_encoding(frame) if isinstance(frame, bytes) else ""
        text = frame.decode(encoding, "surrogatepass") if isinstance(frame, bytes) else frame
        if from_daemon:
            return json.loads(text)
        utf8 = frame if encoding == "utf-8" else text.encode("utf-8", "surrogatepass")
        return (_STRICT if _may_overflow(utf8) else _FAST).decode(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"JSON nested deeper than {MAX_DEPTH} levels") from None


def decode(frame: bytes, max_bytes: int = MAX_FRAME_BYTES, from_daemon: bool = False) -> Envelope:
    """Parse and validate one frame; raises ProtocolError with the reason a client can act on.

    `from_daemon`: a reply or telemetry a client asked for. It skips the nesting walk, which guards a
    daemon against hostile requests and costs milliseconds on a large job's `status`; json's own
    recursion limit still refuses a nesting bomb.
    """
    if len(frame) > max_bytes:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"frame of {len(frame)} bytes exceeds {max_bytes}")
    raw = _parse(frame, from_daemon)
    # Fewer brackets than the limit cannot nest deeper than it: most frames skip the walk (a counted scan in C).
    if not from_daemon and frame.count(b"{") + frame.count(b"[") > MAX_DEPTH and _depth(raw) > MAX_DEPTH:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"JSON nested deeper than {MAX_DEPTH} levels")
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "envelope must be a JSON object")
    version = raw.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:  # true and 1.0 are not the version 1
        raise ProtocolError(ErrorCode.VERSION, f"protocol version {version!r} unsupported (want {PROTOCOL_VERSION})")
    kind, op = raw.get("type"), raw.get("op")
    if kind not in MESSAGE_TYPES:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"field 'type' must be one of {', '.join(MESSAGE_TYPES)}")
    if not isinstance(op, str) or not op:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "field 'op' must be a non-empty string")
    body = raw.get("body", {})
    if not isinstance(body, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "field 'body' must be an object")
    msg_id, node = raw.get("id", ""), raw.get("node", "")
    seq, ts = raw.get("seq", 0), raw.get("ts", 0.0)
    if not isinstance(msg_id, str) or not isinstance(node, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "fields 'id' and 'node' must be strings")
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "field 'seq' must be an integer")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "field 'ts' must be a number")
    return Envelope(type=kind, op=op, body=body, id=msg_id, node=node, seq=seq, ts=float(ts), v=version,
                    size=len(frame))


def reply(request: Envelope, node: str, body: JsonObject) -> Envelope:
    return Envelope(type="rep", op=request.op, body=body, id=request.id, node=node, ts=time.time())


def error_reply(request_id: str, op: str, node: str, err: ProtocolError) -> Envelope:
    return Envelope(type="rep", op=op or "error", body=err.as_body(), id=request_id, node=node, ts=time.time())

