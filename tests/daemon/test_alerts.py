"""`--on-event`: a node's loss and the job's end run the operator's command and reach its webhook."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.harness import TICKER, Job, wait_for

from elasticd.job.config import ConfigError, parse_alert
from elasticd.wire.names import EventKind


class Hook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        Hook.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


def test_a_node_loss_and_the_jobs_end_run_the_command_and_post_to_the_webhook(tmp_path: Path) -> None:
    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    seen = tmp_path / "seen"
    command = f'node_lost,job_end:echo "$ELASTICD_EVENT_KIND $ELASTICD_JOB_ID $(cat)" >> {seen}'
    job = Job(tmp_path, nnodes="1:2", nproc=1, extra=["--on-event", command, "--on-event",
                                                        f"node_lost:http://127.0.0.1:{server.server_port}/hook"])
    try:
        job.start("a", TICKER)
        job.start("b", TICKER)
        job.wait_event("round_started", lambda e: e["world_size"] == 2)
        job.daemon("b").kill_with_workers()
        wait_for(lambda: seen.exists() and "node_lost" in seen.read_text(), timeout=30)
        kind, job_id, event = seen.read_text().splitlines()[0].split(" ", 2)
        assert (kind, job_id, json.loads(event)["node"]) == ("node_lost", job.job_id, "b")
        wait_for(lambda: bool(Hook.received), timeout=30)
        assert Hook.received[0]["kind"] == "node_lost" and Hook.received[0]["node"] == "b"
        follow = subprocess.Popen([sys.executable, "-m", "elasticd.cli", "events", "--follow", "--json"],
                                  env=job.env, stdout=subprocess.PIPE, text=True)
        assert follow.stdout is not None
        job.start("c", TICKER)  # an event after the past ones: once it shows, `--follow` is subscribed
        while json.loads(follow.stdout.readline()).get("node") != "c":
            pass
        job.daemon("a").proc.send_signal(2)  # the last node leaves: the job ends, and its end is paged too
        assert job.daemon("a").wait_exit(30) is not None
        out, _ = follow.communicate(timeout=30)  # `events --follow` ends with the job
        assert follow.returncode == 0 and json.loads(out.splitlines()[-1])["kind"] in ("job_end", "goodput")
        assert [line.split(" ", 1)[0] for line in seen.read_text().splitlines()] == ["node_lost", "job_end"]
    finally:
        job.close()
        server.shutdown()


@pytest.mark.quick
def test_an_alert_rule_names_known_kinds_and_an_action() -> None:
    rule = parse_alert("node_lost, job_end:https://hooks.example/x", EventKind)
    assert rule.kinds == {"node_lost", "job_end"} and rule.webhook and rule.action == "https://hooks.example/x"
    assert parse_alert("*:logger -t elastic", EventKind).kinds == frozenset()
    for bad in ("node_lost", ":cmd", "node_lost:", "straggler_x:cmd"):
        with pytest.raises(ConfigError, match="--on-event"):
            parse_alert(bad, EventKind)
