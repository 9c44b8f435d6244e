#!/usr/bin/env bash
# make stress: the simulated-cluster tests RUNS times in a row (20 by default) beside a
# CPU hog (one busy process per core), each run a fresh pytest in WORKERS pytest-xdist
# workers (auto: one per core, as make test runs them); any failure fails it.
# The sim's tests must never flake on a busy machine: this is where we find out.
set -uo pipefail
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-20}
WORKERS=${WORKERS:-auto}
TESTS=${TESTS:-tests/sim/test_sim.py tests/sim/test_sim_pull.py tests/sim/test_sim_lifecycle.py tests/sim/test_streaming.py tests/sim/test_sim_p2p.py tests/sim/test_sim_write.py tests/sim/test_sim_nixl.py tests/sim/test_sim_scaled.py tests/sim/test_hostile_sequences.py tests/sim/test_strangers_every_socket.py}
cores=$(nproc)
hogs=()
cleanup() { for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null; done; }
trap cleanup EXIT INT TERM
for _ in $(seq "$cores"); do
  "$PY" -c 'while True: pass' &
  hogs+=($!)
done
echo "stress: $RUNS runs of $TESTS in $WORKERS worker(s) beside $cores busy process(es)"
failed=0
for run in $(seq "$RUNS"); do
  started=$(date +%s)
  # shellcheck disable=SC2086  # TESTS is a list of paths
  if CI=1 "$PY" -m pytest -q -p no:cacheprovider -n "$WORKERS" $TESTS >"/tmp/kvspec-stress-$$.log" 2>&1; then
    echo "stress: run $run/$RUNS passed in $(( $(date +%s) - started )) s"
  else
    failed=$((failed + 1))
    echo "stress: run $run/$RUNS FAILED in $(( $(date +%s) - started )) s:"
    grep -E "^(FAILED|ERROR)|Error|assert" "/tmp/kvspec-stress-$$.log" | head -20
  fi
done
rm -f "/tmp/kvspec-stress-$$.log"
echo "stress: $((RUNS - failed)) of $RUNS runs passed"
[ "$failed" -eq 0 ]
