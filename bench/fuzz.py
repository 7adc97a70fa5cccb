"""Fuzz every elasticd input surface at scale: `bench/fuzz.py --cases 100000 [--out fuzz.json]`.

Runs tests/reliability/test_fuzz.py (the same targets and invariants as CI) with every target's case count multiplied
so that the total reaches --cases, then prints the cases per target and whether the live daemons survived
and still answered `status` correctly. Exit 0 when every check held and the total reached --cases.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CI_TOTAL = 20_000  # about what tests/reliability/test_fuzz.py runs at FUZZ_SCALE=1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--out", default="", help="write the counts and results as JSON here")
    args = parser.parse_args()
    scale = max(1.0, args.cases / CI_TOTAL * 1.1)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "fuzz.json"
        env = {**os.environ, "FUZZ_SCALE": f"{scale:.3f}", "FUZZ_REPORT": str(report)}
        started = time.monotonic()
        test = ROOT / "tests" / "reliability" / "test_fuzz.py"
        done = subprocess.run([sys.executable, "-m", "pytest", str(test), "-q",
                               "-p", "no:cacheprovider", "-W", "ignore", "-o", "timeout=0"],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        result = json.loads(report.read_text()) if report.exists() else {"counts": {}, "total": 0}
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "(no pytest output)"
    result.update(scale=scale, wall_s=round(wall, 1), pytest=summary, pytest_rc=done.returncode)
    print(f"fuzzed {result['total']} cases in {wall:.0f}s (scale {scale:.2f}):")
    for target, count in sorted(result["counts"].items()):
        print(f"  {target:24} {count:8}")
    status = result.get("status_after", {})
    print(f"daemons alive after fuzzing: {result.get('daemons_alive')}; status: state={status.get('state')} "
          f"round={status.get('round')} world_size={status.get('world_size')} "
          f"nodes={[(n['node_id'], n['status']) for n in status.get('nodes', [])]}")
    print(f"pytest: {summary}")
    if done.returncode != 0:
        print(done.stdout[-5000:], done.stderr[-2000:], sep="\n")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0 if done.returncode == 0 and result["total"] >= args.cases else 1


if __name__ == "__main__":
    sys.exit(main())
