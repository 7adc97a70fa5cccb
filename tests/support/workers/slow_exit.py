"""A worker that raises under torch's @record, then takes its time to exit (a CUDA teardown, a loaded machine's)."""

import atexit
import sys
import time

from torch.distributed.elastic.multiprocessing.errors import record

atexit.register(time.sleep, float(sys.argv[1]))  # after the traceback and the error file: the process lingers


@record  # torch's own: the exception goes to TORCHELASTIC_ERROR_FILE before the process is gone
def main() -> None:
    time.sleep(0.5)
    raise ValueError("bad batch at step 3")


main()
