#!/usr/bin/env bash
# The wheel is the product: build it, install it into a fresh virtual environment
# outside the repository, with no test dependencies, and use it as a stranger would.
# Then check the sdist carries what its tests need and that those tests run from it.
#
#   tools/wheel_smoke.sh            (make test runs it; PYTHON picks the interpreter)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
DEV_PY=${DEV_PY:-$repo/.venv/bin/python}
DEV_PY=$(cd "$(dirname "$DEV_PY")" && pwd)/$(basename "$DEV_PY")  # we change directory below
work=$(mktemp -d "${TMPDIR:-/tmp}/kvspec-smoke-XXXXXX")
trap 'rm -rf "$work"' EXIT
step() { printf 'wheel smoke [%3ds]: %s\n' "$SECONDS" "$*" >&2; }

step "building the wheel and the sdist"
"$DEV_PY" -m pip --disable-pip-version-check -q wheel --no-deps -w "$work/dist" "$repo"
(cd "$repo" && "$DEV_PY" - "$work/dist" <<'PY'
import sys
from setuptools import build_meta  # the project's own build backend, no isolation needed

build_meta.build_sdist(sys.argv[1])
PY
) >/dev/null
wheel=$(ls "$work"/dist/kvspec-*.whl)
sdist=$(ls "$work"/dist/kvspec-*.tar.gz)

step "a fresh venv outside the repository, torch, then the wheel alone"
"$PYTHON" -m venv "$work/venv"
# This venv lives for one run: torch goes in without compiling its ~10k modules to
# bytecode (about a minute), and the modules imported are compiled once, on first use.
unset PYTHONDONTWRITEBYTECODE
VENV="$work/venv" TORCH_PIP_ARGS=--no-compile "$repo/tools/install_torch.sh"
"$work/venv/bin/python" -m pip --disable-pip-version-check -q install --no-compile "$wheel"
cd "$work"
py="$work/venv/bin/python"
bin="$work/venv/bin"

if "$py" -c 'import pytest' 2>/dev/null; then
  echo "wheel smoke: pytest is installed in the fresh venv; the check is void" >&2
  exit 1
fi
"$bin/kvspec" --help >/dev/null
"$bin/kvspec" --version
"$bin/kvspec" plan --source-tp 8 --target-tp 2 --kv-heads 4 --json - >/dev/null
"$py" -m sim --version
# The installed CLI starts without torch: help, version, clauses and plan with torch
# made unimportable (a None entry in sys.modules refuses the import).
for args in "--help" "--version" "clauses" "plan --source-tp 8 --target-tp 2 --kv-heads 4"; do
  "$py" -c 'import sys; sys.modules["torch"] = None; from kvspec.cli import main; sys.exit(main(sys.argv[1:]))' \
    $args >/dev/null || { echo "wheel smoke: kvspec $args needs torch" >&2; exit 1; }
done
step "kvspec conform reference --profile dev --jobs 2"
"$bin/kvspec" conform reference --profile dev --jobs 2 --quiet --json "$work/conform.json" >/dev/null
step "kvspec adapter new (the wheel's template) passes kvspec conform as written"
mkdir "$work/scaffold"
(cd "$work/scaffold" && "$bin/kvspec" adapter new smoke_adapter >/dev/null \
  && "$bin/kvspec" conform smoke_adapter:adapter --profile dev --clause PLAN --quiet >/dev/null)
step "kvspec vectors check --impl reference (the vectors installed with the wheel)"
"$bin/kvspec" vectors check --impl reference >/dev/null
"$bin/kvspec" vectors export "$work/vectors" >/dev/null
cmp "$work/vectors/manifest.json" "$("$py" -c 'from kvspec.conformance.vectors import GOLDEN_DIR; print(GOLDEN_DIR)')/manifest.json"
step "python -m sim run"
"$py" -m sim run --source-tp 4 --target-tp 2 --kv-heads 4 --quiet --ports os --requests 4 >/dev/null
step "python -m sim run --transport gloo (the tensor frames over torch.distributed)"
"$py" -m sim run --source-tp 4 --target-tp 2 --kv-heads 4 --quiet --ports os --requests 4 \
  --transport gloo >/dev/null
step "torchrun -m sim.node (two workers on this host, the store on a free port, a run key)"
# docs/multihost.md's recipe for the key every host shares out of band: a file only we can read.
(umask 077 && "$py" -c 'import secrets; print(secrets.token_hex(32))' > "$work/run.key")
"$bin/torchrun" --standalone --nproc-per-node 2 -m sim.node --source-tp 2 --target-tp 2 \
  --kv-heads 2 --quiet --ports os --requests 2 --key-file "$work/run.key" \
  >/dev/null 2>"$work/node.err" \
  || { cat "$work/node.err" >&2; exit 1; }
"$py" -c 'import kvspec, sim, pathlib; assert (pathlib.Path(kvspec.__file__).parent / "py.typed").exists()'

step "the pytest plugin, once pytest is installed"
"$py" -m pip --disable-pip-version-check -q install pytest
mkdir -p "$work/user" && cd "$work/user"
printf 'def test_mine():\n    assert True\n' > test_mine.py
"$py" -m pytest -q -p no:cacheprovider | tail -1 | grep -q "1 passed"  # idle without an impl
"$py" -m pytest -q -p no:cacheprovider --kvspec-impl reference --kvspec-clause PLAN-3 \
  | tail -1 | grep -qE "^[0-9]+ passed"

step "the sdist carries its tests, and they run from it"
cd "$work"
tar -xzf "$sdist"
src=$(ls -d "$work"/kvspec-*/)
for needed in LICENSE README.md mkdocs.yml docs/index.md tests/conftest.py \
              examples/field_adapter.py kvspec/conformance/golden/manifest.json; do
  [ -e "$src/$needed" ] || { echo "wheel smoke: the sdist lacks $needed" >&2; exit 1; }
done
(cd "$src" && CI=1 "$DEV_PY" -m pytest -q -p no:cacheprovider tests/spec/test_plan.py \
  tests/suite/test_vectors.py tests/spec/test_keys.py | tail -1)
step "passed"
