"""Every control verb's request is a record: documented field by field, decoded as control.py decodes it, and a
malformed body refused with `bad_argument` and a reason naming the verb and the field."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import pytest
from support.malformed import refused

from elasticd.cli.main import build_parser, verb_request
from elasticd.client import ClientError, _unwrap
from elasticd.commands.registry import REGISTRY
from elasticd.commands.verb import Command
from elasticd.wire.protocol import Envelope, ErrorCode, ProtocolError
from elasticd.wire.verb_replies import ErrorReply, Hello, Plan, Steered
from elasticd.wire.verb_requests import LogsRequest, SteeringRequest, VerbRequest

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

DOC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
COMMON = {f.name for f in dataclasses.fields(SteeringRequest)}  # client, dry_run, force: §3 and §5's preamble
VERBS = sorted(REGISTRY)
SAMPLE = {str: "b", int: 1, float: 1.5, bool: True}
WRONG = {str: 5, int: "1", float: "x", bool: "yes"}  # of each declared type, a JSON value that is not one


def section(verb: str) -> str:
    """The verb's `### ` section of docs/protocol.md (`### cordon / uncordon` is both verbs')."""
    heading = next(line for line in DOC.splitlines() if line.startswith("### ") and verb in line[4:].split(" / "))
    start = DOC.index(heading)
    return DOC[start:DOC.index("\n#", start + len(heading))]


def hints(command: Command[VerbRequest]) -> dict[str, typing.Any]:
    return typing.get_type_hints(command.request)


def present(hint: typing.Any) -> typing.Any:
    """The type a field holds when it is there: `int` of `int | None`, `list` of `list[str]`."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return present(next(a for a in typing.get_args(hint) if a is not type(None)))
    return typing.get_origin(hint) or hint


def required(command: Command[VerbRequest]) -> dict[str, object]:
    """The smallest body the verb's request decodes: a sample of each field without a default."""
    return {f.name: SAMPLE[present(hints(command)[f.name])] for f in dataclasses.fields(command.request)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def refusal(op: str, body: object) -> str:
    return refused(REGISTRY[op].request, op, body, ErrorCode.BAD_ARGUMENT)  # as ControlPlane.handle decodes it


@pytest.mark.parametrize("op", VERBS)
def test_each_field_of_a_verbs_request_is_in_its_section(op: str) -> None:
    own = [f.name for f in dataclasses.fields(REGISTRY[op].request) if f.name not in COMMON]
    assert [name for name in own if f"`{name}`" not in section(op)] == []


def test_the_common_fields_are_documented_once_for_every_verb() -> None:
    preamble = DOC[DOC.index("## 3. Envelope"):DOC.index("### 5.1")]
    assert [name for name in sorted(COMMON) if f"`{name}`" not in preamble] == []


def test_the_typed_replies_are_documented() -> None:
    verbs = DOC[DOC.index("## 5. Verbs"):DOC.index("## 6.")]
    assert [f.name for f in dataclasses.fields(Plan) if f"`{f.name}`" not in verbs] == []
    assert [f.name for f in dataclasses.fields(Hello) if f.name != "ok" and f"`{f.name}`" not in section("hello")] == []
    assert [f.name for f in dataclasses.fields(ErrorReply) if f"`{f.name}`" not in DOC[DOC.index("## 4."):]] == []


@pytest.mark.parametrize("op", VERBS)
def test_a_missing_field_is_refused_by_name(op: str) -> None:
    body = required(REGISTRY[op])
    for name in body:
        assert refusal(op, {k: v for k, v in body.items() if k != name}) == f"{op}: field '{name}' is missing"


@pytest.mark.parametrize("op", VERBS)
def test_a_field_of_the_wrong_type_is_refused_by_name(op: str) -> None:
    for name, hint in hints(REGISTRY[op]).items():
        kind = present(hint)
        wrong = WRONG.get(kind, "x")  # a list given a string
        assert refusal(op, {**required(REGISTRY[op]), name: wrong}).startswith(f"{op}: field '{name}' must be ")
        if kind is int:  # true is not the integer 1
            assert f"field '{name}'" in refusal(op, {**required(REGISTRY[op]), name: True})


@pytest.mark.parametrize("op", VERBS)
def test_a_huge_integer_is_refused_by_name(op: str) -> None:
    ints = [name for name, hint in hints(REGISTRY[op]).items() if present(hint) in (int, float)]
    for name in ints:
        assert f"field '{name}'" in refusal(op, {**required(REGISTRY[op]), name: 2**64})


@pytest.mark.parametrize("op", VERBS)
def test_a_body_that_is_no_object_is_refused(op: str) -> None:
    for body, kind in (([], "list"), ("nodes", "str"), (3, "int"), (None, "null")):
        assert refusal(op, body) == f"{op}: body must be an object, got {kind}"


@pytest.mark.parametrize("op", VERBS)
def test_an_unknown_field_is_ignored(op: str) -> None:
    command = REGISTRY[op]
    body = required(command)
    assert command.decode({**body, "from_a_newer_client": [1, {"x": None}]}) == command.decode(body)
    assert isinstance(command.decode(body), command.request)


def test_cross_field_checks_name_what_is_wrong() -> None:
    assert refusal("logs", {"node": "b", "since": 10}) == "logs: 'since' reads one rank's log: give 'rank' too"
    assert refusal("logs", {"node": "b", "rank": -1}) == "logs: field 'rank' must be a whole number ≥ 0"
    assert refusal("logs", {"node": "b", "tail": 2**53}) == "logs: field 'tail' must be a whole number ≥ 0"
    assert refusal("stacks", {"node": "b", "rank": -2}) == "stacks: field 'rank' must be a whole number ≥ 0"
    assert refusal("status", {"nodes_limit": -1}) == "status: nodes_offset and nodes_limit must be 0 or more"
    assert refusal("events", {"kinds": ["round_started", 3]}) == "events: field 'kinds[1]' must be str, got int"
    assert REGISTRY["logs"].decode({"node": "b", "rank": 0, "since": 0, "round": None}) == \
        LogsRequest(node="b", rank=0, since=0)


def argv(command: Command[VerbRequest], every: bool) -> list[str]:
    """A command line with the verb's positional arguments, and with `every`, each option too, valued by type."""
    line = [command.name]
    for a in command.args:
        if a.flags and every:
            line += [a.flags[0]] + ([] if a.action == "store_true" else [{int: "3", float: "2.5"}.get(a.type, "b")])
        elif not a.flags and (every or not a.optional):
            line.append("3" if a.type is int else "b")
    return line + (["--dry-run", "--force"] if command.steer and every else [])


@pytest.mark.parametrize("op", VERBS)
def test_the_cli_sends_bodies_its_verb_decodes(op: str) -> None:
    command = REGISTRY[op]
    for every in (False, True):
        request = verb_request(build_parser().parse_args(argv(command, every)))
        assert isinstance(request, command.request) and command.decode(request.encode()) == request


def test_a_steering_reply_carries_only_what_applies() -> None:
    plan = Plan(summary="world 4 → 2", world_before=4, world_after=2, nodes_after=["a"], ranks_leaving=[2, 3],
                ranks_moving={})
    assert Steered(dry_run=True, plan=Plan(summary="x")).encode() == {"ok": True, "dry_run": True,
                                                                      "plan": {"summary": "x"}}
    assert Steered(accepted=True, op_id="o1", plan=plan).encode() == {
        "ok": True, "accepted": True, "op_id": "o1",
        "plan": {"summary": "world 4 → 2", "world_before": 4, "world_after": 2, "nodes_after": ["a"],
                 "ranks_leaving": [2, 3], "ranks_moving": {}}}
    assert Steered.decode(Steered(accepted=True, plan=plan).encode()) == Steered(accepted=True, plan=plan)


def test_the_client_decodes_an_error_reply_once() -> None:
    body = ProtocolError(ErrorCode.REFUSED, "would leave 0 node(s)").as_body()
    assert ErrorReply.of(body) == ErrorReply(errno=5, code="refused", reason="would leave 0 node(s)")
    assert ErrorReply.of({"ok": True, "nodes": {}}) is None
    with pytest.raises(ClientError) as info:
        _unwrap(Envelope("rep", "drain", body))
    assert (info.value.errno, info.value.code, info.value.reason) == (5, "refused", "would leave 0 node(s)")
    with pytest.raises(ClientError) as info:  # an error reply whose fields are not what §4 says
        _unwrap(Envelope("rep", "drain", {"ok": False, "errno": "5"}))
    assert info.value.code == "bad_message" and "field 'errno'" in info.value.reason
