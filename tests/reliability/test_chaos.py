"""CHAOS SOAK (short CI version, about 2 minutes): tests/support/soak.py for 5 seeded faults (2.5 minutes at most).

Worker SIGKILL and SIGSTOP, member daemon SIGKILL and restart, drain/scale storms, rapid operator commands and
a flapping node against a real 3-node train_shim job; then the job must reach its target step with at most one
checkpoint interval lost per restart, no rank in two worlds at once, every restart with a cause, and no orphan
or zombie process. The full soak is `bench/chaos_soak.py --minutes 5` (docs/reliability.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.soak import Soak, SoakConfig, summary


@pytest.mark.timeout(360)
def test_chaos_soak_short(tmp_path: Path) -> None:
    run = Soak(SoakConfig(minutes=2.5, faults=5, seed=7, steps=300, finish_timeout=150.0), tmp_path)
    try:
        result = run.run()
    finally:
        run.job.close()
    print("\n" + summary(result))
    assert sum(result["faults"].values()) == 5, result["fault_log"]  # none skipped, and the job outlived them
    failed = {name: v for name, v in result["invariants"].items() if not v["ok"]}
    assert not failed, failed
