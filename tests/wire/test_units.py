"""Pure pieces: envelope validation, sticky rank order, rank maps, flag parsing."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re

import pytest

from elasticd.coordinator.membership import NodeRecord, build_rank_map, sticky_order
from elasticd.job.config import ConfigError, parse_endpoint, parse_nnodes
from elasticd.job.logsink import SecondCachedFormatter, TurnBufferedHandler
from elasticd.wire.protocol import MAX_FRAME_BYTES, Envelope, ErrorCode, ProtocolError, decode, encode
from elasticd.wire.verb_requests import RanksRequest, ScaleRequest

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`


def node(node_id: str, seq: int, nproc: int = 2) -> NodeRecord:
    return NodeRecord(node_id, "127.0.0.1", nproc, "i", seq)


def test_survivors_keep_their_order_and_newcomers_append() -> None:
    nodes = [node("c", 3), node("a", 1), node("d", 4)]
    assert sticky_order(["b", "c", "a"], nodes) == ["c", "a", "d"]
    assert sticky_order([], nodes) == ["a", "c", "d"]


def test_rank_map_numbers_ranks_by_group_order_with_uneven_nodes() -> None:
    records = {"x": node("x", 1, 2), "y": node("y", 2, 3)}
    entries, world = build_rank_map(["y", "x"], records)
    assert world == 5
    assert [(e.node_id, e.group_rank, e.ranks) for e in entries] == [("y", 0, [0, 1, 2]), ("x", 1, [3, 4])]


def test_envelope_round_trip_and_nan_becomes_null() -> None:
    env = decode(encode(Envelope("ev", "step", {"loss": float("nan"), "step": 3}, id="x", node="a", seq=9)))
    assert (env.type, env.op, env.id, env.node, env.seq) == ("ev", "step", "x", "a", 9)
    assert env.body == {"loss": None, "step": 3}


@pytest.mark.parametrize(("frame", "errno"), [
    (b"{", ErrorCode.INVALID_JSON),
    (b"\xff\xfe", ErrorCode.INVALID_JSON),
    (b"[]", ErrorCode.BAD_MESSAGE),
    (json.dumps({"v": 2, "type": "req", "op": "x"}).encode(), ErrorCode.VERSION),
    (json.dumps({"v": 1, "type": "nope", "op": "x"}).encode(), ErrorCode.BAD_MESSAGE),
    (json.dumps({"v": 1, "type": "req", "op": ""}).encode(), ErrorCode.BAD_MESSAGE),
    (json.dumps({"v": 1, "type": "req", "op": "x", "body": []}).encode(), ErrorCode.BAD_MESSAGE),
    (json.dumps({"v": 1, "type": "req", "op": "x", "seq": True}).encode(), ErrorCode.BAD_MESSAGE),
    (b" " * (MAX_FRAME_BYTES + 1), ErrorCode.BAD_MESSAGE),
])
def test_bad_frames_are_refused_with_their_error_number(frame: bytes, errno: int) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(frame)
    assert info.value.errno == errno


def test_typed_arguments_refuse_booleans_for_integers() -> None:
    assert ScaleRequest.decode({"nodes": 3}).nodes == 3
    assert RanksRequest.decode({}).history == 20
    for body in ({"nodes": True}, {"nodes": "3"}, {}):
        with pytest.raises(ProtocolError) as info:
            ScaleRequest.decode(body)
        assert info.value.errno == ErrorCode.BAD_ARGUMENT


def test_flag_parsing() -> None:
    assert parse_nnodes("2") == (2, 2) and parse_nnodes("1:4") == (1, 4)
    assert parse_endpoint("[::1]:29400") == ("::1", 29400) and parse_endpoint("host") == ("host", 29400)
    for bad in ("0", "3:2", "a:b", ""):
        with pytest.raises(ConfigError):
            parse_nnodes(bad)


def test_subscription_sequence_drops_duplicates_and_fills_gaps_from_events_and_heartbeats() -> None:
    from elasticd.client import Event, _Sequence

    def ev(n: int) -> Event:
        return Event("ev", "k", "a", n, 0.0)

    history = [{"seq": n, "kind": "k", "node": "a", "ts": 0.0} for n in range(1, 10)]
    seq = _Sequence(3)
    assert not seq.accept(ev(3))  # already in the snapshot
    assert seq.accept(ev(4)) and seq.last == 4
    assert seq.gap(ev(7))  # 5 and 6 went missing
    assert [e.seq for e in seq.fill(history, ev(7))] == [5, 6]
    assert seq.accept(ev(7)) and seq.last == 7
    beat = Event("hb", "heartbeat", "a", 9, 0.0)  # a quiet tail: the heartbeat knows of events up to 9
    assert seq.gap(beat) and [e.seq for e in seq.fill(history, beat)] == [8, 9]
    assert seq.accept(beat) and not seq.gap(beat)


def test_console_liveness_thresholds_follow_the_heartbeat_rule() -> None:
    from tui.liveness import liveness

    assert [liveness(age) for age in (0.0, 1.4, 1.5, 2.9, 3.0, 60.0)] == \
        ["live", "live", "stale", "stale", "missing", "missing"]
    assert liveness(0.1, connected=False) == "missing" and liveness(None) == "missing"
    assert liveness(0.1, status="lost") == "lost"


def test_a_shim_rank_whose_first_step_report_is_on_its_way_answers_step_0_not_no_shim() -> None:
    """Else a join right after a start would restart it like a plain worker and repeat what it trained."""
    from elasticd.member.rank_reports import step_answer
    from elasticd.wire.names import OUTPUT

    assert step_answer({0: {"rank": 0, "round": 2, "hello": 1.0}}, 2) == {"step": 0, "step_time": None}
    assert step_answer({0: {"rank": 0, "round": 2, "hello": 1.0, "step": 7, "step_time": 0.5},
                         1: {"rank": 1, "round": 2, "hello": 1.0}}, 2) == {"step": 7, "step_time": 0.5}
    assert step_answer({0: {"rank": 0, "round": 1, "hello": 1.0, "step": 7}}, 2)["step"] is None  # old round
    assert step_answer({0: {"rank": 0, "round": 2, "source": OUTPUT, "step": 9}}, 2)["step"] is None


class _CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_log_lines_of_one_loop_turn_go_out_in_one_write_and_none_is_lost() -> None:
    stream = _CountingStream()
    handler = TurnBufferedHandler(stream)
    handler.setFormatter(SecondCachedFormatter("%(asctime)s elasticd %(message)s"))
    log = logging.getLogger("test-turn-buffer")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)

    async def a_round() -> int:
        for node in range(100):  # a round's line per node, in one loop turn
            log.info("[n%d] workers_stopped round=2", node)
        written = stream.writes
        await asyncio.sleep(0)  # the turn ends
        await asyncio.sleep(0)
        return written

    try:
        log.info("before the loop")  # no loop running: written at once
        assert stream.writes == 1
        assert asyncio.run(a_round()) == 1 and stream.writes == 2
        lines = stream.getvalue().splitlines()
        assert len(lines) == 101 and lines[-1].endswith("elasticd [n99] workers_stopped round=2")
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} elasticd before the loop", lines[0])
    finally:
        log.removeHandler(handler)
