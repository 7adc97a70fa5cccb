"""A fast, torch-free trainer_shim worker: reports steps (loss, samples) and a checkpoint; stops when drained."""

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout

import trainer_shim

parser = argparse.ArgumentParser()
parser.add_argument("--interval", type=float, default=0.05)
parser.add_argument("--batch", type=int, default=8, help="samples per step")
parser.add_argument("--wait-for", type=Path, help="open the session only once this file exists (a slow start)")
parser.add_argument("--keep-on-sigterm", action="store_true",
                    help="a framework's SIGTERM handler: take note and train on (its daemon SIGKILLs it later)")
parser.add_argument("--step-log", type=Path, help="append 'ROUND STEP' for each step trained")
args = parser.parse_args()
if args.keep_on_sigterm:
    signal.signal(signal.SIGTERM, lambda *_: None)
while args.wait_for and not args.wait_for.exists():
    time.sleep(0.02)
session = trainer_shim.init()
for step in range(1, 10**9):
    time.sleep(args.interval)
    if args.step_log:
        with args.step_log.open("a") as log:
            log.write(f"{os.environ.get('ELASTICD_ROUND')} {step}\n")
    session.report(step, loss=1.0 / step, samples=args.batch)
    if step == 1 or session.should_checkpoint(step):
        session.report_checkpoint(step, f"ckpt/step-{step}", 1024, 0.001, session.last_request_id)
    if session.should_stop(step):  # a drain: say the step is saved, then exit 0
        session.report_checkpoint(step, f"ckpt/step-{step}", 1024, 0.001, session.last_request_id)
        session.drained(step)
        break
session.close()
