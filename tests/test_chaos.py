"""CHAOS SOAK (short CI version, about 2.5 minutes): bench/chaos_soak.py for 1.5 minutes of seeded faults.

Worker SIGKILL and SIGSTOP, member daemon SIGKILL and restart, drain/scale storms, rapid operator commands and
a flapping node against a real 3-node train_shim job; then the job must reach its target step with at most one
checkpoint interval lost per restart, no rank in two worlds at once, every restart with a cause, and no orphan
or zombie process. The full soak is `bench/chaos_soak.py --minutes 5` (docs/reliability.md).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parent.parent / "bench" / "chaos_soak.py"


@pytest.mark.timeout(300)
def test_chaos_soak_short(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("chaos_soak", SOAK)
    assert spec is not None and spec.loader is not None
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    args = argparse.Namespace(minutes=1.5, seed=7, steps=300, ckpt_every=1, step_time=0.2, finish_timeout=150.0)
    run = soak.Soak(args, tmp_path)
    try:
        result = run.run()
    finally:
        run.job.close()
    print("\n" + soak.summary(result))
    assert sum(result["faults"].values()) >= 5, result["fault_log"]
    failed = {name: v for name, v in result["invariants"].items() if not v["ok"]}
    assert not failed, failed
