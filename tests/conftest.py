"""Test set-up: tests import their support code as `support.*` (tests/support/); the longest files run first, by their
recorded seconds; the quick lane's tests may start no process."""

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # `support` is tests/support/
# One intra-op thread in every process the tests start, as elasticd gives its workers (as torchrun does): two threads
# a process on a loaded 2-core machine wait on each other at every op (a three-rank heal test took 7.5 s alone and
# 116 s beside the suite's other files). Daemons are started without it: they set their workers' own.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from support.durations import FileSeconds, known

QUICK_ONLY = ("a test marked `quick` started a process ({what}): the quick lane runs no daemon, no subprocess and "
              "no system package; drop the file's quick mark")


def refuse(what: str) -> Callable[..., Any]:
    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError(QUICK_ONLY.format(what=what))
    return fail


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # this process sees every test's report: xdist's controller, or the only one
        config.pluginmanager.register(FileSeconds(config), "elastic-file-seconds")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files in the order `make test` hands them to its workers (--dist loadfile, --no-loadscope-reorder): by
    their recorded seconds (support/durations.py), the longest first, each followed by the shortest left. A long
    file never starts last to run alone at the end, and the first files at work are not all the heaviest at once
    (they slowed each other past a test's timeout)."""
    seconds = known(getattr(config, "cache", None))
    files = sorted({item.path.name for item in items}, key=lambda name: (-seconds.get(name, 0), name))
    order = {name: i for i, name in enumerate(interleaved(files))}
    items.sort(key=lambda item: order[item.path.name])  # stable: a file's own order is kept


def interleaved(longest_first: list[str]) -> list[str]:
    """The first, the last, the second, the one before the last...: the heavy files each beside a light one."""
    out, lo, hi = [], 0, len(longest_first) - 1
    while lo <= hi:
        out.append(longest_first[lo])
        if lo != hi:
            out.append(longest_first[hi])
        lo, hi = lo + 1, hi - 1
    return out


@pytest.fixture(autouse=True)
def quick_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The `quick` mark is checked, not trusted: a quick test that starts a process fails and says so."""
    if request.node.get_closest_marker("quick") is not None:
        monkeypatch.setattr(subprocess.Popen, "__init__", refuse("subprocess"))
        monkeypatch.setattr(asyncio, "create_subprocess_exec", refuse("asyncio subprocess"))
        monkeypatch.setattr(os, "fork", refuse("fork"))
    yield
