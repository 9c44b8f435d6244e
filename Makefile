# The two commands of the README:
#   make run    the main job, on a fresh machine
#   make test   the whole test suite (lint, tests)
# Both create or refresh the virtual environment first (tools/bootstrap.sh).
# Override the torch build with, e.g.:
#   make test TORCH='torch==2.5.1' TORCH_INDEX=https://download.pytorch.org/whl/cu121

VENV ?= .venv
TORCH ?=
TORCH_INDEX ?=
PY := $(VENV)/bin/python

.PHONY: setup run test clean

setup:
	@VENV=$(VENV) TORCH='$(TORCH)' TORCH_INDEX='$(TORCH_INDEX)' tools/bootstrap.sh

run: setup
	$(VENV)/bin/kvspec plan --source-tp 8 --target-tp 2 --kv-heads 4

test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache
