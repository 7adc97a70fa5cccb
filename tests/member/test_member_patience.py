"""A member judges the coordinator silent only for time it ran itself and once the coordinator's frames are read."""

from __future__ import annotations

import contextlib
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any

import pytest

from elasticd.job.config import JobConfig
from elasticd.job.events import EventLog
from elasticd.member.link import EXIT_COORDINATOR_LOST, WEDGED_LIMITS, Member
from elasticd.wire.names import MeshOp
from elasticd.wire.protocol import Envelope

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

T0 = 1000.0


class Life:
    """The daemon as a member sees it: what it was told to finish with."""

    def __init__(self) -> None:
        self.ended: list[int | None] = []

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        with contextlib.suppress(StopIteration):  # `finish` awaits nothing here: one step runs it to its end
            coro.send(None)

    async def finish(self, state: str, reason: str, code: int | None = None, message: str = "") -> None:
        self.ended.append(code)

    def fail_start(self, message: str) -> None:
        raise AssertionError(message)


def member(queued: list[bool], link: list[bool] | None = None, via: str = "",
           routes: list[str] | None = None) -> tuple[Member, Life]:
    cfg = JobConfig(1, 2, 1, "127.0.0.1", 29400, "job", "b", ["train.py"])
    node = SimpleNamespace(heartbeat_body=lambda _now: {}, beats=SimpleNamespace(ack=lambda _beat: None))
    life = Life()
    m = Member(cfg, node, SimpleNamespace(), lambda _op, _body: None, life, EventLog(),  # type: ignore[arg-type]
               lambda _event: None, lambda _env: None, 60.0, is_coordinator=False,
               link=SimpleNamespace(backlog=lambda: queued[0], link_up=lambda: bool(link and link[0]),
                                    route=(routes if routes is not None else []).append,
                                    state=lambda: {"via": via}))
    m.registered, m.last_coord = True, T0
    m.receive(Envelope("req", MeshOp.hb, {"seq": 1}, node="a"))
    m.last_coord = T0  # as if that answer came at T0
    m.last_beat = T0
    return m, life


def beat_until(m: Member, life: Life, times: list[float]) -> float | None:
    for now in times:
        m.beat(now)
        if life.ended:
            return now
    return None


def test_punctual_beats_and_no_answer_for_3s_end_the_node() -> None:
    m, life = member([False])
    assert beat_until(m, life, [T0 + i for i in range(1, 6)]) == T0 + 4  # 4 s > 3 s: lost
    assert life.ended == [EXIT_COORDINATOR_LOST]


def test_a_starved_member_gets_its_own_lateness_back() -> None:
    """Each beat 0.8 s late (a loaded machine): only the time it ran counts against the coordinator."""
    m, life = member([False])
    late = [T0 + 1.8 * i for i in range(1, 4)]  # 5.4 s of wall time, 3 s of it its own running time
    assert beat_until(m, life, late) is None
    assert beat_until(m, life, [T0 + 5.4 + 1.0 + 0.1]) == T0 + 6.5  # then a punctual beat past the limit


def test_answers_waiting_unread_are_no_silence() -> None:
    queued = [True]
    m, life = member(queued)
    assert beat_until(m, life, [T0 + i for i in range(1, 6)]) is None  # the frames are there, just not read yet
    queued[0] = False
    assert beat_until(m, life, [T0 + 6]) == T0 + 6


def test_a_coordinator_holding_the_connection_is_slow_not_gone_until_it_is_wedged() -> None:
    """Its ZeroMQ I/O thread answers the transport heartbeats while its loop is starved: wait, within bounds."""
    link = [True]
    m, life = member([False], link)
    assert beat_until(m, life, [T0 + i for i in range(1, 10)]) is None  # 9 s of silence, connection held
    limit = WEDGED_LIMITS * m.cfg.lost_after_s
    assert beat_until(m, life, [T0 + i for i in range(10, int(limit) + 3)]) == T0 + int(limit) + 1


def test_a_dropped_connection_and_3s_of_silence_end_the_node() -> None:
    link = [True]
    m, life = member([False], link)
    assert beat_until(m, life, [T0 + 1, T0 + 2, T0 + 3, T0 + 4]) is None
    link[0] = False  # the coordinator died (its connection closed) or froze (the transport heartbeat timed out)
    assert beat_until(m, life, [T0 + 5]) == T0 + 5


def test_a_relay_that_passes_nothing_on_for_3s_is_left_for_the_coordinator() -> None:
    """Its link to us held (it lives, cut off from the coordinator or stalled): straight to the coordinator."""
    routes: list[str] = []
    m, life = member([False], [True], via="tcp://relay:1", routes=routes)
    beat_until(m, life, [T0 + 1, T0 + 2, T0 + 3])
    assert routes == []
    beat_until(m, life, [T0 + 4])
    assert routes == [""] and life.ended == []  # not the coordinator's silence: it has not judged it yet
