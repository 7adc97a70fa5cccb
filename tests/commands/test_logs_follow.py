"""`elasticd logs NODE RANK --follow` across a restart: the rank's new log is followed from its first line."""

from __future__ import annotations

from itertools import islice
from typing import Any

import pytest

from elasticd.commands.verbs import logs
from elasticd.wire.verb_requests import LogsRequest

pytestmark = pytest.mark.quick


class Node:
    """A node's `logs` answers: round 2's log, then (once `restart`ed) round 3's; its ranks' lines by round."""

    def __init__(self) -> None:
        self.round = 2
        self.written = {2: ["step 240"]}
        self.calls = 0

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        self.calls += 1
        assert op == "logs" and args["rank"] == 1 and self.calls < 100, "the follow never went on to round 3"
        rnd = args.get("round") or self.round
        data = "".join(f"{line}\n" for line in self.written[rnd])
        since = args.get("since")
        tail = args.get("tail") or 0
        lines = data[since:].splitlines() if since is not None else self.written[rnd][-tail:] if tail else []
        return {"ok": True, "node": "a", "round": rnd,
                "ranks": [{"rank": 1, "lines": lines, "offset": len(data), "note": ""}]}


def test_a_follow_goes_on_into_the_ranks_log_of_the_next_round(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "FOLLOW_POLL_S", 0)
    node = Node()
    request = LogsRequest(node="a", rank=1, tail=1)
    first = logs.COMMANDS[0].answer(node.call("logs", **request.encode()))  # as the CLI decodes it
    followed = logs.follow(node.call, request, first)
    assert next(followed) == "step 240"
    node.written[2].append("step 250")  # its last line, then a crash: round 3 writes a new log
    node.written[3], node.round = ["resumed at 201", "step 210"], 3
    assert list(islice(followed, 4)) == ["step 250", "── round 3 ──", "resumed at 201", "step 210"]
    node.written[3].append("step 220")
    assert next(followed) == "step 220"
