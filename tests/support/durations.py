"""Seconds per test file, for starting the longest files first: recorded in pytest's cache at the end of a run that
timed whole files, and seeded from durations.json for the files the cache does not know (a fresh checkout).

`make durations` (this file as a script) copies the cache's values into durations.json, to commit after a full run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

KEY = "elastic/file_seconds"  # pytest's cache key: {test file name: seconds}
SEED = Path(__file__).with_name("durations.json")
ROOT = Path(__file__).resolve().parents[2]


def seed() -> dict[str, float]:
    return json.loads(SEED.read_text()) if SEED.exists() else {}


def known(cache: Any) -> dict[str, float]:
    """Each file's seconds: the cache's (pytest's `config.cache`, None without it), else the seed's."""
    cached = cache.get(KEY, None) if cache is not None else None
    return {**seed(), **(cached or {})}


def whole_files(session: pytest.Session, exitstatus: int) -> bool:
    """Whether this run timed whole files: none narrowed (-k, -m, --lf, --sw, --deselect, -x, file::test) and the
    run not cut short; a narrowed run's sums would understate its files."""
    option, config = session.config.option, session.config
    narrowed = (getattr(option, "keyword", "") or getattr(option, "markexpr", "") or getattr(option, "lf", False)
                or getattr(option, "stepwise", False) or getattr(option, "stepwise_skip", False)
                or getattr(option, "deselect", None) or getattr(option, "maxfail", 0)
                or any("::" in arg for arg in config.args))
    finished = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) \
        and not session.shouldfail and not session.shouldstop
    return finished and not narrowed


class FileSeconds:
    """Sums each test file's seconds (setup, call and teardown of each of its tests) as reports arrive: under xdist
    in the controller, from every worker. At the session's end they go into the cache, merged with earlier values
    for the files this run did not time, or timed with a failure (often a wait to its timeout: not the file's time)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = {}
        self.failed: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = Path(report.nodeid.split("::", 1)[0]).name
        self.seconds[name] = self.seconds.get(name, 0.0) + report.duration
        if report.failed:
            self.failed.add(name)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        cache = getattr(self.config, "cache", None)  # none with -p no:cacheprovider
        timed = {name: round(s, 1) for name, s in self.seconds.items() if name not in self.failed}
        if cache is None or not timed or not whole_files(session, exitstatus):
            return
        cache.set(KEY, {**cache.get(KEY, {}), **timed})


def write_seed() -> int:
    """durations.json from the cache: every test file of the checkout, longest first; a file neither the cache nor
    the seed knows gets 0."""
    cached_file = ROOT / ".pytest_cache" / "v" / KEY
    if not cached_file.exists():
        print(f"no recorded durations in {cached_file.relative_to(ROOT)}: run the whole suite (`make test`) first",
              file=sys.stderr)
        return 1
    seconds = {**seed(), **json.loads(cached_file.read_text())}
    names = {path.name for path in (ROOT / "tests").rglob("test_*.py")}
    rows = sorted(((name, seconds.get(name, 0)) for name in names), key=lambda row: (-row[1], row[0]))
    SEED.write_text(json.dumps(dict(rows), indent=1) + "\n")
    print(f"{SEED.relative_to(ROOT)}: {len(rows)} files, {sum(s for _, s in rows):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(write_seed())
