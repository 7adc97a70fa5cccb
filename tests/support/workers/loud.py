"""A torch-free worker that prints badly on demand: 10 MB lines, binary bytes, or 10,000 lines a second."""

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--triggers", type=Path, required=True, help="big-RANK, binary-RANK or flood-RANK: rank acts once")
args = parser.parse_args()
rank = os.environ["RANK"]
out = sys.stdout.buffer


def once(name: str) -> bool:
    trigger = args.triggers / f"{name}-{rank}"
    if not trigger.exists():
        return False
    trigger.unlink()
    return True


for tick in itertools.count(1):
    if once("big"):
        for _ in range(3):
            out.write(b"x" * (10 * 1024 * 1024) + b"\n")  # one line of 10 MB
    if once("binary"):
        out.write(bytes(range(256)) * 64 + b"\xff\xfe\xc3(\n" + os.urandom(4096) + b"\n")
    if once("flood"):
        start = time.monotonic()
        for burst in range(300):  # 100 lines every 10 ms for 3 s: 10,000 lines a second
            out.write(b"".join(b"flood %d %d\n" % (burst, i) for i in range(100)))
            out.flush()
            time.sleep(max(0.0, start + (burst + 1) * 0.01 - time.monotonic()))
    out.write(b"tick=%d\n" % tick)
    out.flush()
    time.sleep(0.05)
