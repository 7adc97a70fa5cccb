"""`logs NODE [RANK]`: what a node's workers printed, answered by that node's daemon (--follow for new lines)."""

import time
from collections.abc import Iterator

from elasticd.commands.port import NodePort
from elasticd.commands.verb import Arg, Caller, Command
from elasticd.wire.read_replies import LogEntry, LogsReply
from elasticd.wire.verb_requests import LogsRequest

FOLLOW_POLL_S = 0.25


async def on_node(port: NodePort, request: LogsRequest) -> LogsReply:
    return port.output(request.rank, request.round, request.tail, request.since)


def render(result: LogsReply) -> str:
    """One rank: its lines. Several: each under a header naming the rank, its process and its state."""
    ranks = result.ranks
    out: list[str] = []
    for entry in ranks:
        if len(ranks) > 1:
            code = "" if entry.get("exit_code") is None else f", exit code {entry['exit_code']}"
            out.append(f"── rank {entry.get('rank')} (pid {entry.get('pid')}, {entry.get('state')}{code}) "
                       f"{entry.get('path')} ──")
        out.extend(lines_of(entry))
    return "\n".join(out)


def lines_of(entry: LogEntry, said: str = "") -> list[str]:
    """The entry's lines after its note (unless `said` already, as a follower's last poll did) and any skip."""
    notes = [f"(log: {entry['note']})"] if entry.get("note") and entry["note"] != said else []
    skipped = [f"(… {entry['skipped']} bytes skipped: output faster than a follower reads …)"] \
        if entry.get("skipped") else []
    return [*notes, *skipped, *entry.get("lines", [])]


def follow(call: Caller, request: LogsRequest, first: LogsReply) -> Iterator[str]:
    """Print the tail, then poll for lines past its offset, one rank at a time, until the node stops answering.
    When a poll brings nothing, the node is asked for its newest round: a restart's new log is followed from its
    first line (a rank no longer on the node ends the follow with the node's refusal)."""
    yield render(first)
    entries = first.ranks
    if len(entries) != 1:
        yield "(--follow follows one rank: give RANK)"
        return
    rank, offset, said = entries[0]["rank"], entries[0].get("offset", 0), entries[0].get("note", "")
    round_id = first.round
    while True:
        time.sleep(FOLLOW_POLL_S)
        entries = ask(call, LogsRequest(node=request.node, rank=rank, round=round_id, since=offset)).ranks
        if not entries:
            yield f"(node {request.node} no longer holds rank {rank}'s log: the follow ends)"
            return
        entry = entries[0]
        offset = entry.get("offset", offset)
        yield from lines_of(entry, said)
        said = entry.get("note", "")
        newest = round_id if entry.get("lines") else ask(call, LogsRequest(node=request.node, rank=rank, tail=0)).round
        if newest > round_id:
            yield f"── round {newest} ──"
            round_id, offset, said = newest, 0, ""


def ask(call: Caller, request: LogsRequest) -> LogsReply:
    """One poll of a follower: the node's reply, as its record."""
    return LogsReply.decode(call("logs", **request.encode()), "logs reply")


COMMANDS = [Command(
    "logs", "a worker's output: logs NODE [RANK] [--tail N] [--round R] [--follow]", LogsRequest, order=35,
    on_node=on_node, reply=LogsReply, render=render, follow=follow,
    args=(Arg("node", "node id"),
          Arg("rank", "global rank (default: every rank of the node)", type=int, optional=True),
          Arg("tail", "the last N lines (at most 1000)", type=int, flags=("--tail", "-n"), default=20),
          Arg("round", "a round that ended (default: the node's newest)", type=int, flags=("--round",)),
          Arg("follow", "go on printing new lines, about 4 times a second", type=None, flags=("--follow", "-f"),
              default=False, action="store_true", cli_only=True)),
)]
