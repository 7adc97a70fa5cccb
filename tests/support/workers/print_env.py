"""A torch-free test worker: prints `env=` and the JSON of the named environment variables, then exits 0."""

import json
import os
import sys

print("env=" + json.dumps({name: os.environ.get(name) for name in sys.argv[1:]}), flush=True)
