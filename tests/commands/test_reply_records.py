"""A read verb's reply is its record, decoded once where the CLI receives it: a reply it cannot read is said."""

from __future__ import annotations

from typing import Any

import pytest

from elasticd.cli import main as cli
from elasticd.commands.registry import REGISTRY
from elasticd.wire.protocol import ProtocolError

pytestmark = pytest.mark.quick

LOGS = {"ok": True, "node": "b", "round": 3, "ranks": [
    {"rank": 1, "pid": 4242, "state": "running", "exit_code": None, "path": "/logs/rank-1.log", "source": "file",
     "note": "", "skipped": 0, "lines": ["step 40 loss 0.21"], "offset": 8812}]}


class Daemon:
    """The CLI's client, answering every call with one body."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def __call__(self, *_args: Any) -> Daemon:
        return self

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def call(self, op: str, **_args: Any) -> dict[str, Any]:
        return self.body


def run(monkeypatch: pytest.MonkeyPatch, body: dict[str, Any], *argv: str) -> int:
    monkeypatch.setattr(cli, "Client", Daemon(body))
    return cli.main([*argv, "--connect", "tcp://127.0.0.1:1"])


def test_the_cli_prints_a_reply_from_its_record(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
                                                ) -> None:
    assert run(monkeypatch, LOGS, "logs", "b", "1") == 0
    assert capsys.readouterr().out == "step 40 loss 0.21\n"


@pytest.mark.parametrize(("change", "said"), [
    ({"round": "3"}, "field 'round' must be int, got str"),
    ({"ranks": [{"rank": 1, "lines": "step 40"}]}, "field 'ranks[0].lines' must be list, got str"),
    ({"node": None}, "field 'node' must be str, got null"),
])
def test_a_reply_the_cli_cannot_read_is_an_error_naming_the_field(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], change: dict[str, Any], said: str) -> None:
    assert run(monkeypatch, {**LOGS, **change}, "logs", "b", "1") == 1
    err = capsys.readouterr().err
    assert said in err and "[bad_message]" in err and "Traceback" not in err


def test_a_reply_missing_a_field_names_it() -> None:
    with pytest.raises(ProtocolError, match="field 'node' is missing"):
        REGISTRY["logs"].answer({k: v for k, v in LOGS.items() if k != "node"})



def test_a_status_from_a_daemon_before_the_newer_fields_still_prints(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The protocol's first fields only (no goodput, stragglers, spares, paging): printed, not refused."""
    old = {"ok": True, "job_id": "job1", "state": "running", "round": 2, "world_size": 4, "min_nodes": 1,
           "max_nodes": 2, "target": 2, "coordinator": "a", "restarts": {"failure": 0}, "max_restarts": 3, "seq": 11,
           "nodes": [{"node_id": "a", "host": "127.0.0.1", "role": "active", "status": "alive",
                      "last_seen_age_s": 0.4}]}
    assert run(monkeypatch, old, "status") == 0
    out = capsys.readouterr().out
    assert "job job1  state running  round 2  world 4" in out and out.splitlines()[-1].startswith("a ")
