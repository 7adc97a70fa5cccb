"""A fast, torch-free trainer_shim worker: reports steps (loss, samples) and a checkpoint; stops when drained."""

import argparse
import atexit
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout (tests/support/workers/ is 3 down)

import trainer_shim

parser = argparse.ArgumentParser()
parser.add_argument("--interval", type=float, default=0.05)
parser.add_argument("--batch", type=int, default=8, help="samples per step")
parser.add_argument("--wait-for", type=Path, help="open the session only once this file exists (a slow start)")
parser.add_argument("--keep-on-sigterm", action="store_true",
                    help="a framework's SIGTERM handler: take note and train on (its daemon SIGKILLs it later)")
parser.add_argument("--step-log", type=Path, help="append 'ROUND STEP TIME' for each step trained")
parser.add_argument("--save-s", type=float, default=0.001, help="how long a requested save takes")
parser.add_argument("--resume", type=Path, help="rank 0 writes each requested save's step here; all resume after it")
parser.add_argument("--lockstep", type=Path,
                    help="a folder: no rank starts step k+1 before every rank of its round finished step k, as ranks "
                         "in one collective do (unpaced ranks drift apart by seconds under load)")
args = parser.parse_args()


def stop(*_: object) -> None:
    """A SIGTERM ends it between steps (a step it logged, it reported). Exiting already, a second one (the daemon
    stopping the round) just ends it: not a SystemExit inside the interpreter's shutdown, a traceback."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.exit(143)


# --keep-on-sigterm: a framework's handler, which only takes note.
signal.signal(signal.SIGTERM, (lambda *_: None) if args.keep_on_sigterm else stop)
while args.wait_for and not args.wait_for.exists():
    time.sleep(0.02)
session = trainer_shim.init()
atexit.register(session.close)  # on a SIGTERM's exit too: its last reports go out
first = int(args.resume.read_text()) + 1 if args.resume and args.resume.exists() else 1


def save(step: int) -> None:
    """A requested save: rank 0 writes it (as a DDP script's rank 0 does) and takes --save-s to."""
    if os.environ.get("RANK") != "0":
        return
    time.sleep(args.save_s)
    if args.resume:
        args.resume.write_text(str(step))
    session.report_checkpoint(step, f"ckpt/step-{step}", 1024, args.save_s, session.last_request_id)


def finished(step: int) -> None:
    """--lockstep: this rank finished `step` in its round."""
    if args.lockstep:
        mine = args.lockstep / os.environ["RANK"]
        written = mine.with_suffix(".tmp")
        written.write_text(f"{os.environ.get('ELASTICD_ROUND')} {step}")
        written.replace(mine)  # whole: a peer never reads half of it


def peers_finished(step: int) -> None:
    """--lockstep: wait (as a collective does, for as long as it takes) until every rank of the round finished
    `step`; a peer that died leaves this rank waiting until its daemon stops the round."""
    def done(rank: int) -> bool:
        try:
            rnd, reached = (args.lockstep / str(rank)).read_text().split()
        except (OSError, ValueError):
            return False
        return rnd == os.environ.get("ELASTICD_ROUND") and int(reached) >= step
    while args.lockstep and not all(done(r) for r in range(int(os.environ["WORLD_SIZE"]))):
        time.sleep(0.005)


for step in range(first, 10**9):
    time.sleep(args.interval)
    if step > first:
        peers_finished(step - 1)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    session.report(step, loss=1.0 / step, samples=args.batch)
    if args.step_log:
        with args.step_log.open("a") as log:
            log.write(f"{os.environ.get('ELASTICD_ROUND')} {step} {time.time()}\n")
    finished(step)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if step == 1:
        session.report_checkpoint(step, f"ckpt/step-{step}", 1024, 0.001, None)
    if session.should_checkpoint(step):
        save(step)
    if session.should_stop(step):  # a drain: save, say the step is saved, then exit 0
        save(step)
        session.drained(step)
        break

# Exiting: a SIGTERM from here on (the daemon stopping the round) just ends it. The interpreter's shutdown (its
# threads' join, then the atexit hooks) is no place for a SystemExit.
if not args.keep_on_sigterm:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
