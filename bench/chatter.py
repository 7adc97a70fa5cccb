"""A torch-free worker that prints `--rate` lines a second (in 10 ms batches) while told to, else 1 line a second."""

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--rate", type=int, default=1000, help="lines a second")
parser.add_argument("--loud-node", default="", help="only this node's ranks print at --rate")
parser.add_argument("--loud-while", type=Path, help="print at --rate only while this file exists")
args = parser.parse_args()
rank = os.environ.get("RANK", "?").encode()
mine = not args.loud_node or os.environ.get("ELASTICD_NODE_ID") == args.loud_node
out = sys.stdout.buffer
LINE = b"rank %s line %d.%d loss 0.1234 lr 3e-4 tokens/s 123456 grad_norm 1.0\n"
loud, checked = False, 0.0
for tick in itertools.count():
    if time.monotonic() - checked > 0.1:
        loud, checked = mine and (args.loud_while is None or args.loud_while.exists()), time.monotonic()
    batch = max(1, args.rate // 100) if loud else 1
    out.write(b"".join(LINE % (rank, tick, i) for i in range(batch)))
    out.flush()
    time.sleep(0.01 if loud else 1.0)
