"""The quick lane's promise is checked: a test marked `quick` that starts a process fails and says why."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`


def test_a_quick_test_that_runs_a_subprocess_fails_and_says_why() -> None:
    with pytest.raises(AssertionError, match=r"marked `quick` started a process \(subprocess\)"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_a_quick_test_that_forks_or_spawns_from_asyncio_fails_too() -> None:
    with pytest.raises(AssertionError, match=r"\(fork\)"):
        os.fork()
    with pytest.raises(AssertionError, match=r"\(asyncio subprocess\)"):
        asyncio.run(asyncio.create_subprocess_exec(sys.executable, "-c", "pass"))
