"""`events`: the bounded job event history, filtered by kind, time or sequence number."""

import time

from elasticd.commands.event_text import line
from elasticd.commands.port import JobPort
from elasticd.commands.verb import Arg, Command
from elasticd.wire.read_replies import EventsReply
from elasticd.wire.verb_requests import EventsRequest


def read(c: JobPort, request: EventsRequest) -> EventsReply:
    return EventsReply(events=c.events.query(request.kinds, request.since_ts, request.since_seq, request.limit),
                       seq=c.events.seq)


def since_ts(seconds_ago: float) -> float:
    return time.time() - seconds_ago if seconds_ago else 0.0


def render(result: EventsReply) -> str:
    return "\n".join(line(e) for e in result.events) or "(no events)"


COMMANDS = [Command(
    "events", "job events (--follow to stream them)", EventsRequest, order=40, read=read, reply=EventsReply,
    render=render,
    args=(Arg("follow", "stream events as they happen", type=None, flags=("--follow", "-f"), default=False,
              action="store_true", cli_only=True),
          Arg("kind", "only these kinds (repeatable)", flags=("--kind",), default=[], action="append", field="kinds"),
          Arg("since", "only events newer than this many seconds", type=float, flags=("--since",), default=0.0,
              field="since_ts", to_request=since_ts),
          Arg("limit", "at most this many past events", type=int, flags=("--limit",), default=200)),
)]
