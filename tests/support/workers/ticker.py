"""A fast, torch-free test worker: prints its env contract once, then `tick=N` lines; can fail on purpose."""

import argparse
import json
import os
import sys
import time

CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "ELASTICD_WORKER_ADDR",
            "ELASTICD_NODE_ID", "ELASTICD_ROUND", "ELASTICD_JOB_ID", "ELASTICD_HANG_TIMEOUT")

parser = argparse.ArgumentParser()
parser.add_argument("--ticks", type=int, default=100000)
parser.add_argument("--interval", type=float, default=0.05)
parser.add_argument("--exit-code", type=int, default=0, help="exit with this code after --ticks")
parser.add_argument("--ignore-sigterm", action="store_true")
parser.add_argument("--forever-rank", type=int, default=-1, help="this rank never exits (a hung teardown)")
parser.add_argument("--term-delay", type=float, default=0.0, help="take this long to exit on SIGTERM (a slow teardown)")
args = parser.parse_args()
if args.ignore_sigterm or args.term_delay:
    import signal

    def slow_exit(*_: object) -> None:
        time.sleep(args.term_delay)
        sys.exit(143)

    signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_sigterm else slow_exit)
print("env=" + json.dumps({k: os.environ.get(k) for k in CONTRACT}), flush=True)
forever = os.environ.get("RANK") == str(args.forever_rank)
for tick in range(10**9 if forever else args.ticks):
    print(f"tick={tick} rank={os.environ.get('RANK')} world={os.environ.get('WORLD_SIZE')}", flush=True)
    time.sleep(args.interval)
sys.exit(args.exit_code)
