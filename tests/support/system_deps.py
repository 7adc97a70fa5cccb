"""Programs tests need (prometheus, ip): found, installed with apt when root, else a stated skip (in CI a failure)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from typing import NoReturn

import pytest

APT_TIMEOUT_S = 600
APT_ENV = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def unavailable(reason: str) -> NoReturn:
    """Skip, except in CI, where a test that needs root must run: there it fails with the reason."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run this test, but {reason}")
    pytest.skip(reason)


@functools.cache
def _apt_update() -> str:
    """`apt-get update`, once per test session; its error output, empty when it worked."""
    result = subprocess.run(["apt-get", "update"], capture_output=True, text=True, env=APT_ENV,
                            timeout=APT_TIMEOUT_S)
    return "" if result.returncode == 0 else result.stderr.strip()[-300:] or f"exit {result.returncode}"


def require_binary(binary: str, package: str) -> str:
    """The path of `binary`; installs Debian's `package` first when it is missing and we are root."""
    found = shutil.which(binary)
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        unavailable(f"`{binary}` is not installed; install it with `apt-get install -y {package}` (as root)")
    error = _apt_update()
    if error:
        unavailable(f"`{binary}` is not installed and `apt-get update` failed: {error}")
    # Another apt on this machine (a parallel test run) holds the lock for a while: wait for it, do not fail.
    result = subprocess.run(["apt-get", "install", "-y", "-o", "DPkg::Lock::Timeout=300", package],
                            capture_output=True, text=True, env=APT_ENV, timeout=APT_TIMEOUT_S)
    found = shutil.which(binary)
    if result.returncode != 0 or found is None:
        unavailable(f"`apt-get install -y {package}` did not give `{binary}`: {result.stderr.strip()[-300:]}")
    return found
