"""Chaos soak CLI: `bench/chaos_soak.py --minutes 5 --seed 1 --out chaos.json`.

Runs the soak of tests/support/soak.py (the faults and the invariants are described below) for --minutes, prints its
summary and writes it as JSON to --out; exit 0 when every invariant held.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # bench -> tests, never the reverse
from support import soak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, epilog=soak.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="target step (default: about what --minutes reaches)")
    parser.add_argument("--ckpt-every", type=int, default=1)
    parser.add_argument("--step-time", type=float, default=0.2)
    parser.add_argument("--finish-timeout", type=float, default=600.0, help="seconds to wait for the job's end")
    parser.add_argument("--out", default="")
    parser.add_argument("--keep", default="", help="keep logs and checkpoints in this folder")
    args = parser.parse_args()
    cfg = soak.SoakConfig(minutes=args.minutes, seed=args.seed,
                          steps=args.steps or int(args.minutes * 60 * 4),  # at most 5 steps/s: ends after the schedule
                          ckpt_every=args.ckpt_every, step_time=args.step_time, finish_timeout=args.finish_timeout)
    with tempfile.TemporaryDirectory(prefix="chaos-") as scratch:
        tmp = Path(args.keep or scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        run = soak.Soak(cfg, tmp)
        try:
            result = run.run()
        finally:
            run.job.close()
    print(soak.summary(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
