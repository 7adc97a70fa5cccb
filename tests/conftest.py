"""Test set-up: tests import their support code as `support.*` (tests/support/); the quick lane's tests may start no
process."""

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # `support` is tests/support/

# The longest files first, by their summed time in one `make test` beside the others (s: 134 for the two sharded
# files, 129, 102, 99, 91, 69, 68, 58, 55, 50, 44, 41, 41, 38, 36, 36, 35, 27, 23, 22, 20, 19, 15, 14, 13): among
# its four workers, a long file begun last runs alone at the end.
LONGEST_FIRST = ("test_sharded_e2e.py", "test_etcd_failover.py", "test_job_wide_signal.py", "test_chaos.py",
                 "test_slurm_cluster.py", "test_fuzz.py", "test_shim_e2e.py", "test_membership.py",
                 "test_diagnosis_hosts.py",
                 "test_resize_e2e.py", "test_shim_example.py", "test_sharded_fsdp_e2e.py", "test_scenario_e2e.py",
                 "test_kubernetes.py", "test_two_hosts.py", "test_integrations.py", "test_etcd_partition.py",
                 "test_resize_generation.py", "test_resize_hosts.py", "test_relay_e2e.py", "test_start_errors.py",
                 "test_stragglers_e2e.py", "test_output_metrics.py", "test_goodput_e2e.py", "test_tui_live.py",
                 "test_dead_node.py", "test_store_tunnel.py")
QUICK_ONLY = ("a test marked `quick` started a process ({what}): the quick lane runs no daemon, no subprocess and "
              "no system package; drop the file's quick mark")


def refuse(what: str) -> Callable[..., Any]:
    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError(QUICK_ONLY.format(what=what))
    return fail


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept


@pytest.fixture(autouse=True)
def quick_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The `quick` mark is checked, not trusted: a quick test that starts a process fails and says so."""
    if request.node.get_closest_marker("quick") is not None:
        monkeypatch.setattr(subprocess.Popen, "__init__", refuse("subprocess"))
        monkeypatch.setattr(asyncio, "create_subprocess_exec", refuse("asyncio subprocess"))
        monkeypatch.setattr(os, "fork", refuse("fork"))
    yield
