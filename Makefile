# The two commands of the README:
#   make run    the main job on a fresh machine: a simulated cluster moves and verifies KV
#   make test   the whole test suite, in stages (setup, ruff, types (mypy over kvspec/,
#               sim/ and field/report/), pytest, the notebooks, the wheel smoke test):
#               every stage runs even after one fails, and a table of each stage's result
#               and time ends it (tools/stages.sh)
# Both create or refresh the virtual environment first (tools/bootstrap.sh).
# Also the quick tier: make check (ruff, mypy, the spec's unit and property tests at the
# quick Hypothesis profile, the reference through the conformance suite's quick profile),
# under two minutes on two cores.
# Override the torch build with, e.g.:
#   make test TORCH='torch==2.5.1' TORCH_INDEX=https://download.pytorch.org/whl/cu121
#
# Also: make smoke (build the wheel, install it in a fresh venv, use it), make test-gpu
# (tools/gpu_check.sh: the suite with CUDA required, a sim run, the benchmarks' CUDA
# rows and the conformance suite on cuda; fails without a GPU), make stress (the sim
# tests 20 times beside a CPU hog; RUNS=N), make fuzz (every parser of user input
# fuzzed, 10**5 inputs each), make headlines (the headline accuracy over the whole
# mutant corpus, >= 95 %: about an hour of one CPU), make bench (the benchmark table, --quick), make vectors
# (regenerate the golden vectors), make notebooks (execute and render the notebooks),
# make field (real engines through the suite: builds .venv-field, rewrites
# docs/field-report.md with the report builder field/report/; see field/run.sh).
# make docs: the docs site (mkdocs.yml) built with --strict into site/; not part of make test.

VENV ?= .venv
TORCH ?=
TORCH_INDEX ?=
PY := $(VENV)/bin/python
# pytest workers (pytest-xdist): one more than the CPUs, since some tests mostly wait
# (heartbeats, link cuts, kernels starting); TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))

# The spec's own unit and property tests (tests/spec: pure functions; no processes, CLI or
# notebooks): what make check runs. tests/ is grouped by role: spec, suite (the conformance
# suite testing itself), sim, cli, field (the field tools: report builder, worker harness),
# docs (README, docs pages and notebooks).
SPEC_TESTS := tests/spec
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal

.PHONY: setup run test check smoke test-gpu stress fuzz faults headlines bench vectors notebooks field field-report clean

setup:
	@VENV=$(VENV) TORCH='$(TORCH)' TORCH_INDEX='$(TORCH_INDEX)' tools/bootstrap.sh

run: setup
	$(PY) -m sim run --source-tp 8 --target-tp 2 --kv-heads 4

test:
	@tools/stages.sh test \
	  "setup=VENV=$(VENV) TORCH='$(TORCH)' TORCH_INDEX='$(TORCH_INDEX)' tools/bootstrap.sh" \
	  "ruff=$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check ." \
	  "types=$(VENV)/bin/mypy" \
	  "pytest=$(PYTEST) --ignore tests/docs/test_notebooks.py" \
	  "notebooks=$(PYTEST) tests/docs/test_notebooks.py" \
	  "wheel smoke=DEV_PY=$(PY) tools/wheel_smoke.sh"

check:
	@tools/stages.sh check \
	  "setup=VENV=$(VENV) TORCH='$(TORCH)' TORCH_INDEX='$(TORCH_INDEX)' tools/bootstrap.sh" \
	  "ruff=$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check ." \
	  "types=$(VENV)/bin/mypy" \
	  "spec tests=KVSPEC_PROFILE=quick $(PYTEST) $(SPEC_TESTS)" \
	  "reference=$(VENV)/bin/kvspec conform reference --profile quick --quiet"

smoke: setup
	DEV_PY=$(PY) tools/wheel_smoke.sh

test-gpu: setup
	PY=$(PY) PYTEST_ARGS="-n $(TEST_WORKERS) --dist worksteal" tools/gpu_check.sh

stress: setup
	PY=$(PY) tools/stress.sh

# Every parser of a user's input fuzzed at length (issue 45): 10**5 inputs each (layout
# files, the shared JSON reader, skips files, --replay, desc --check lists, --faults) by
# default, FUZZ_EXAMPLES=N for another count; make test runs the same tests at a sample.
FUZZ_EXAMPLES ?= 100000
FUZZ_TESTS := tests/spec/test_layout_file_fuzz.py tests/suite/test_user_input_fuzz.py tests/sim/test_faults_fuzz.py
fuzz: setup
	KVSPEC_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PYTEST) -q -p no:cacheprovider $(FUZZ_TESTS)

# The fault matrix at a real size (issue 45.5): every fault each transport accepts, on
# every transport, at 2,048 tokens a request (tests/sim/test_faults_at_size.py); make test
# runs two samples of it.
faults: setup
	KVSPEC_FAULT_MATRIX=1 $(PYTEST) -q -p no:cacheprovider tests/sim/test_faults_at_size.py

# The headline accuracy over the whole own mutant corpus (issue 43): about an hour of one
# CPU, so not part of make test (which runs the headline tests of single causes).
headlines: setup
	KVSPEC_HEADLINES=1 $(PYTEST) -q -p no:cacheprovider tests/suite/test_headlines.py

bench: setup
	$(PY) -m benchmarks --quick

notebooks: setup
	$(PY) tools/render_notebooks.py

vectors: setup
	$(VENV)/bin/kvspec vectors export kvspec/conformance/golden

CONFORM_JSON ?= --json
field:
	CONFORM_JSON=$(CONFORM_JSON) field/run.sh

# Rewrite docs/field-report.{md,json} from the last `make field`'s reports/field/ and the
# ledger field/defects.json, without running the engines again (seconds): the report
# builder field/report/ (python -m field.report; the project's tool, not in the wheel).
field-report:
	.venv-field/bin/python -m field.report --reports reports/field --ledger field/defects.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache .mypy_cache

# The docs site: every page under docs/, the README as its home, built with --strict (a
# broken link or anchor, or a page left out of mkdocs.yml's nav, fails it) into site/.
# The versions pinned in docs/requirements.txt go into a venv of their own on first use.
DOCS_VENV ?= .venv-docs
.PHONY: docs
docs: $(DOCS_VENV)/.docs-stamp
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict

$(DOCS_VENV)/.docs-stamp: docs/requirements.txt
	[ -x $(DOCS_VENV)/bin/python ] || $${PYTHON:-python3} -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip --disable-pip-version-check -q install -r docs/requirements.txt
	touch $@
