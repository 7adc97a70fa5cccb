"""A fast, torch-free trainer_shim worker: reports steps (loss, samples) and a checkpoint; stops when drained."""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout

import trainer_shim

parser = argparse.ArgumentParser()
parser.add_argument("--interval", type=float, default=0.05)
parser.add_argument("--batch", type=int, default=8, help="samples per step")
args = parser.parse_args()
session = trainer_shim.init()
for step in range(1, 10**9):
    time.sleep(args.interval)
    session.report(step, loss=1.0 / step, samples=args.batch)
    if step == 1 or session.should_checkpoint(step):
        session.report_checkpoint(step, f"ckpt/step-{step}", 1024, 0.001, session.last_request_id)
    if session.should_stop(step):  # a drain: say the step is saved, then exit 0
        session.report_checkpoint(step, f"ckpt/step-{step}", 1024, 0.001, session.last_request_id)
        session.drained(step)
        break
session.close()
