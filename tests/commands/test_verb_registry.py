"""A verb is one module: `bookmark`, dropped into elasticd/commands/verbs/ of a copy of the project and edited nowhere
else, is in `elasticd --help`, runs on a daemon through the CLI, and is a key and a palette entry in the console."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from support.harness import TICKER, Job

from elasticd.cli.main import build_parser
from elasticd.commands.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]  # where `support` is

BOOKMARK = '''"""`bookmark`: a labelled marker in the job's event log (a verb only this test has)."""

from dataclasses import dataclass

from elasticd.commands.port import JobPort
from elasticd.commands.verb import Arg, Command, ConsoleAction
from elasticd.wire.verb_replies import Plan, Steered
from elasticd.wire.verb_requests import SteeringRequest


@dataclass(frozen=True, kw_only=True)
class BookmarkRequest(SteeringRequest):
    label: str = "console"


def plan(c: JobPort, request: BookmarkRequest) -> Plan:
    return Plan(summary=f"bookmark '{request.label}' goes into the event log")


def apply(c: JobPort, request: BookmarkRequest, plan: Plan) -> Steered:
    c.emit("bookmark", label=request.label)
    return Steered(accepted=True)


COMMANDS = [Command("bookmark", "put a labelled marker into the event log", BookmarkRequest, plan=plan, apply=apply,
                    args=(Arg("label", "the marker's text", flags=("--label",)),),
                    console=(ConsoleAction("bookmark", "b", "Bookmark the event log"),))]
'''

# The console, from the copy, on the copy's daemon: the palette, then the key `b` with its confirmation.
CONSOLE = '''
import asyncio, json, sys
from support.console import SIZE, confirm_dialog, until
from tui.app import ElasticApp
from tui.commands import ActionsProvider


async def main(job_id, control):
    app = ElasticApp({job_id: [control]})
    seen = {}
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.model.job.world_size == 1, what="the job")
        seen["palette"] = [str(hit.prompt) async for hit in ActionsProvider(app.screen).discover()]
        await pilot.press("b")
        dialog = await confirm_dialog(pilot)
        seen["effect"] = str(dialog.query_one("#effect").render())
        await pilot.click("#confirm")
        await until(pilot, lambda: any("accepted" in n.message for n in app._notifications), what="accepted")
    print(json.dumps(seen))


asyncio.run(main(*sys.argv[1:]))
'''


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("verb") / "src"
    for package in ("elasticd", "tui", "trainer_shim"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    (src / "elasticd" / "commands" / "verbs" / "bookmark.py").write_text(BOOKMARK)
    return src


def python(src: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run with the copy first on the path (and the cwd outside the repository, which `-m` would put first)."""
    env = {**(env or os.environ), "PYTHONPATH": os.pathsep.join([str(src), str(TESTS)])}
    result = subprocess.run([sys.executable, *args], cwd=src.parent, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def job(src: Path) -> Iterator[Job]:
    (src.parent / "job").mkdir()
    job = Job(src.parent / "job", nnodes="1:1", nproc=1)
    job.env["PYTHONPATH"] = str(src)
    job.start("a", TICKER)
    job.wait_event("round_started")
    yield job
    job.close()


def test_help_shows_the_new_verb_and_its_arguments(src: Path) -> None:
    assert "bookmark" not in build_parser().format_help()  # the verb is the copy's alone
    top = python(src, "-m", "elasticd.cli", "--help").stdout
    assert re.search(r"bookmark\s+put a labelled marker into the event log", top)
    own = python(src, "-m", "elasticd.cli", "bookmark", "--help").stdout
    assert "--label LABEL" in own and "the marker's text" in own
    assert "--dry-run" in own and "--force" in own and "--connect" in own  # a steering verb's and every verb's


def test_the_cli_sends_it_and_the_daemon_runs_it(src: Path, job: Job) -> None:
    mark = job.seq()
    dry = python(src, "-m", "elasticd.cli", "bookmark", "--label", "release 1", "--dry-run", "--json", env=job.env)
    assert json.loads(dry.stdout) == {"ok": True, "dry_run": True,
                                      "plan": {"summary": "bookmark 'release 1' goes into the event log"}}
    real = python(src, "-m", "elasticd.cli", "bookmark", "--label", "release 1", env=job.env)
    assert real.stdout.strip() == "accepted: bookmark 'release 1' goes into the event log"
    job.wait_event("bookmark", lambda e: e["label"] == "release 1", since=mark)
    with job.client() as client:
        events = client.call("events", since_seq=mark, limit=0)["events"]
        assert "bookmark" in client.call("hello")["capabilities"]
    assert [e["label"] for e in events if e["kind"] == "bookmark"] == ["release 1"]  # the dry run made none
    received = [e["args"] for e in events if e["kind"] == "command_received"]
    assert received[-1] == {"label": "release 1", "dry_run": False, "force": False}


def test_the_console_offers_it_as_a_key_and_in_the_palette(src: Path, job: Job) -> None:
    mark = job.seq()
    seen = json.loads(python(src, "-c", CONSOLE, job.job_id, job.daemons["a"].control).stdout)
    assert "Bookmark the event log [b]" in seen["palette"]
    assert seen["effect"] == "Effect: bookmark 'console' goes into the event log"
    job.wait_event("bookmark", lambda e: e["label"] == "console", since=mark)


def undocumented(verbs: Iterable[str]) -> list[str]:
    """Verbs missing from docs/protocol.md §5: its table of verbs, or a `### verb` section of their own."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    lines = text[text.index("## 5. Verbs"):text.index("## 6.")].splitlines()
    first = lines.index("| verb | steers | needs `running` | long (`accepted`) | `dry_run` | `force` |")
    table = lines[first:lines.index("", first)]
    listed = {name for line in table for name in re.findall(r"`([^`]+)`", line.split("|")[1])}
    sections = {name for line in lines if line.startswith("### ") for name in line[4:].split(" / ")}
    return [verb for verb in verbs if verb not in listed or verb not in sections]


def test_docs_list_every_verb() -> None:
    assert undocumented(REGISTRY) == []
    assert undocumented(["bookmark"]) == ["bookmark"]  # the check sees a missing verb
