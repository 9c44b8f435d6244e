#!/usr/bin/env bash
# The GPU checks, in one call: the CUDA tests, a simulated-cluster run on cuda, the CUDA
# benchmark rows and the conformance suite on cuda. `make test-gpu` runs it in the
# project's venv; on a borrowed GPU machine that reaches no package index it runs on that
# machine's own python3 (which must hold torch with CUDA) with the wheels that
# tools/gpu_wheels.sh put in .whl/ (see docs/gpu.md).
#
#   GPU_BUDGET_S=540 tools/gpu_check.sh    end every phase inside 540 s (0: no limit)
#
# Environment:
#   PY            the interpreter (.venv/bin/python where it exists, else python3)
#   OUT           where the logs, the summary and the benchmark JSON go (reports/gpu);
#                 seven files, so a tool that returns eight files of a folder gets all
#   PYTEST_ARGS   which tests (-m cuda -n 8: those parametrized or marked for cuda)
#   GPU_BUDGET_S  seconds for every phase together (0: no limit)
#   WHEELS        the wheels to install when PY lacks a package (.whl)
#   GPU_SITE      where they are installed (/tmp/kvspec-gpu-site)
# Exit status: 0 every phase passed; 1 a phase failed or was cut short, or a package is
# missing and cannot be installed; 2 torch finds no GPU.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${PY:-}" ]]; then
  PY=python3
  [[ -x .venv/bin/python ]] && PY=.venv/bin/python
fi
OUT=${OUT:-reports/gpu}
PYTEST_ARGS=${PYTEST_ARGS:--m cuda -n 8}
BUDGET=${GPU_BUDGET_S:-0}
WHEELS=${WHEELS:-.whl}
SITE=${GPU_SITE:-/tmp/kvspec-gpu-site}
NEEDS="zmq multiprocess dill safetensors hypothesis pytest xdist pytest_timeout"
mkdir -p "$OUT"
: >"$OUT/summary.txt"
started=$(date +%s)
failed=0

say() { echo "$*" | tee -a "$OUT/summary.txt"; }

# phase NAME CAP_S COMMAND...: run COMMAND with its output in $OUT/NAME.log, for at most
# CAP_S seconds or what is left of the budget; a phase with under 10 s left is skipped.
phase() {
  local name=$1 cap=$2
  shift 2
  local limit=0
  if ((BUDGET > 0)); then
    limit=$((BUDGET - ($(date +%s) - started)))
    ((limit > cap)) && limit=$cap
    if ((limit < 10)); then
      say "== $name: skipped, the ${BUDGET} s budget is spent"
      failed=1
      return
    fi
  fi
  local t0 rc why=""
  t0=$(date +%s)
  if ((limit > 0)); then
    timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  else
    "$@" >"$OUT/$name.log" 2>&1
  fi
  rc=$?
  ((limit > 0 && (rc == 124 || rc == 137))) && why=" (cut at ${limit} s)"
  say "== $name: exit $rc in $(($(date +%s) - t0)) s$why"
  tail -n 8 "$OUT/$name.log" | sed 's/^/   /'
  ((rc == 0)) || failed=1
}

# The modules of $NEEDS that $PY cannot import, space-separated.
missing() {
  "$PY" -c "
import importlib.util, sys
print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
" $NEEDS
}

# What the machine is, and whether torch sees a GPU there.
environment=$("$PY" - 2>&1 <<'EOF'
import platform, sys
import torch
print("python", sys.version.split()[0], platform.machine())
print("torch", torch.__version__, "CUDA build", torch.version.cuda)
if not torch.cuda.is_available():
    sys.exit(
        f"no CUDA device: torch {torch.__version__} (CUDA build {torch.version.cuda}) "
        "finds none (torch.cuda.is_available() is False)"
    )
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name}, {p.total_memory >> 30} GiB, {p.multi_processor_count} SMs")
EOF
) || {
  say "gpu_check ($PY): $(tail -n 1 <<<"$environment")"
  exit 2
}
say "$environment"

# What the project needs beyond torch: from the carried wheels where the machine lacks it.
lacking=$(missing)
if [[ -n "$lacking" ]]; then
  if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
    say "gpu_check: $PY cannot import $lacking, and $WHEELS/ holds no wheels:"
    say "  make them with tools/gpu_wheels.sh where a package index is reachable, and carry them"
    exit 1
  fi
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl >/tmp/kvspec-gpu-install.log 2>&1; then
    say "gpu_check: installing $WHEELS/ into $SITE failed:"
    tail -n 20 /tmp/kvspec-gpu-install.log | tee -a "$OUT/summary.txt"
    exit 1
  fi
  export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
  still=$(missing)
  if [[ -n "$still" ]]; then
    say "gpu_check: $PY still cannot import $still after installing $WHEELS/ (it lacked"
    say "  $lacking); add wheels of those for this machine's Python to $WHEELS/"
    exit 1
  fi
  say "installed $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS/ for $lacking"
fi

read -r -a pytest_args <<<"$PYTEST_ARGS"
KVSPEC_REQUIRE_CUDA=1 phase pytest 240 "$PY" -m pytest -q -ra -p no:cacheprovider \
  --junitxml "$OUT/pytest.xml" "${pytest_args[@]}"
phase sim 90 "$PY" -m sim run --device cuda --source-tp 4 --target-tp 2 --kv-heads 4 \
  --dtype float8_e4m3fn --src-layout flashinfer --dst-layout flash_attn_hnd \
  --dst-block-size 32 --chunks 2 --quiet --ports os
phase benchmarks 150 "$PY" -m benchmarks --only reshard --only codec \
  --json "$OUT/benchmarks.json" --markdown
phase conform 150 "$PY" -m kvspec conform reference --device cuda --profile ci --quiet

if ((failed)); then
  say "gpu_check: a phase failed or was cut short, in $(($(date +%s) - started)) s; logs in $OUT"
else
  say "gpu_check: every phase passed in $(($(date +%s) - started)) s; logs in $OUT"
fi
exit "$failed"
