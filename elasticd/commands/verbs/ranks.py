"""`ranks`: this round's rank map and the history of earlier rounds."""

from elasticd.commands.port import JobPort
from elasticd.commands.verb import Command
from elasticd.wire.read_replies import RanksReply
from elasticd.wire.verb_requests import RanksRequest


def read(c: JobPort, request: RanksRequest) -> RanksReply:
    limit = request.history
    rounds = [r.public() for r in c.store.rounds()[-limit:]] if limit > 0 else []
    return RanksReply(round=c.round.public() if c.round else None, history=rounds)


def render(result: RanksReply) -> str:
    lines = []
    for rnd in result.history:
        mapping = "  ".join(f"{m['node_id']}={','.join(map(str, m['ranks']))}" for m in rnd["members"])
        lines.append(f"round {rnd['round_id']:>3} world {rnd['world_size']:>3} cause {rnd['cause']:<10} {mapping}")
    return "\n".join(lines) or "(no rounds yet)"


COMMANDS = [Command("ranks", "rank map of this round and earlier ones", RanksRequest, order=20, read=read,
                    reply=RanksReply, render=render)]
