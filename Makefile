# Two entry points for a fresh machine: `make demo` and `make test`. Each sets everything up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	# torch is pinned for dev/CI: 2.13.0 is a local CPU wheel; pyproject keeps a range for GPU users.
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0 numpy -e '.[dev]'
	touch $(STAMP)

.PHONY: setup demo test quick lint durations
setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# Six test files at a time on two cores: a test spends much of its time waiting on daemons and workers (at four, a
# quarter of the CPU sat idle: 9 min 13 s of pytest against 8 min 15 s at six, same quiet machine). Whole files go to
# one worker (loadfile): a module's netns lab or etcd cluster is set up once.
# The longest files start first, each beside a short one, by the seconds each took last time (pytest's cache;
# tests/support/durations.json where the cache has none; tests/conftest.py): `make durations` after a full run copies
# the cache's into that file, to commit. --no-loadscope-reorder keeps that order: xdist otherwise hands out the files
# with the most tests first, and the longest files (one test each) started last and ran alone at the end.
test: $(STAMP) lint
	$(BIN)/python -m pytest -q -n 6 --dist loadfile --no-loadscope-reorder

# The quick lane: the tests that start no daemon, no subprocess and no system package (under a minute).
quick: $(STAMP)
	$(BIN)/python -m pytest -q -m quick

# The seconds per test file recorded by the last whole run (pytest's cache) into tests/support/durations.json.
durations: $(STAMP)
	$(BIN)/python tests/support/durations.py
