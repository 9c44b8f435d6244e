#!/usr/bin/env bash
# The GPU checks, in one call: the CUDA tests, a simulated-cluster run on cuda, the CUDA
# benchmark rows and the conformance suite on cuda. `make test-gpu` runs it in the
# project's venv; on a borrowed GPU machine that reaches no package index it runs on that
# machine's own python3 (which must hold torch with CUDA) with the wheels that
# tools/gpu_wheels.sh put in .whl/ (see README "GPU").
#
#   GPU_BUDGET_S=540 tools/gpu_check.sh    end every phase inside 540 s (0: no limit)
#
# Environment: PY (python3), OUT (reports/gpu: logs, a summary and the benchmark JSON),
# PYTEST_ARGS (-m cuda -n 8: the tests parametrized on cuda), GPU_BUDGET_S (0).
# Exits 0 when every phase passed, 1 when one failed or was cut short, 2 without CUDA.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3}
OUT=${OUT:-reports/gpu}
PYTEST_ARGS=${PYTEST_ARGS:--m cuda -n 8}
BUDGET=${GPU_BUDGET_S:-0}
SITE=${GPU_SITE:-/tmp/kvspec-gpu-site}
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
  local t0 rc
  t0=$(date +%s)
  if ((limit > 0)); then
    timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  else
    "$@" >"$OUT/$name.log" 2>&1
  fi
  rc=$?
  local why=""
  ((rc == 124 || rc == 137)) && why=" (cut at ${limit} s)"
  say "== $name: exit $rc in $(($(date +%s) - t0)) s$why"
  tail -n 8 "$OUT/$name.log" | sed 's/^/   /'
  ((rc == 0)) || failed=1
}

# What the machine is, and whether torch sees a GPU there.
if ! "$PY" - >"$OUT/environment.log" 2>&1 <<'EOF'; then
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
  say "gpu_check: $(tail -n 1 "$OUT/environment.log")"
  exit 2
fi
tee -a "$OUT/summary.txt" <"$OUT/environment.log"

# What the project needs beyond torch: from the carried wheels where the machine lacks it.
if ! "$PY" -c "import zmq, multiprocess, safetensors, hypothesis, pytest, xdist" 2>/dev/null; then
  if ! compgen -G ".whl/*.whl" >/dev/null; then
    say "gpu_check: $PY lacks pyzmq, multiprocess or the test tools, and there is no .whl/:"
    say "  run tools/gpu_wheels.sh where a package index is reachable, and carry .whl"
    exit 1
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl >"$OUT/install.log" 2>&1 || {
    say "gpu_check: installing .whl/ failed:"
    tail -n 20 "$OUT/install.log" | tee -a "$OUT/summary.txt"
    exit 1
  }
  export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
  say "installed $(ls .whl | wc -l) wheels from .whl/ into $SITE"
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

say "gpu_check: $( ((failed)) && echo "a phase failed or was cut short" || echo "every phase passed") in $(($(date +%s) - started)) s; logs in $OUT"
exit "$failed"
