#!/usr/bin/env bash
# Run a make target's stages one after another, past failures, and say how each went.
#
#   tools/stages.sh TARGET 'NAME=COMMAND' ['NAME=COMMAND' ...]
#
# Every stage runs, even after one fails, so one run tells everything that is wrong
# (a failing lint no longer hides the tests, nor a failing test the wheel smoke). A stage
# named `setup` is the exception: nothing can run without it, so its failure stops the
# rest. At the end: a table of each stage's result and wall time, then pytest's own
# closing lines again (the last lines a reader, or CI, sees), and the status: 0 when every
# stage passed, else the first failing stage's.
set -uo pipefail

target=$1
shift
names=() results=() seconds=()
first_failure=0
logdir=$(mktemp -d "${TMPDIR:-/tmp}/kvspec-stages.XXXXXX")
trap 'rm -rf "$logdir"' EXIT
index=0
total=$#
for stage in "$@"; do
  index=$((index + 1))
  name=${stage%%=*}
  command=${stage#*=}
  echo "== make $target: stage $index/$total, $name: $command"
  started=$(date +%s)
  bash -c "$command" 2>&1 | tee "$logdir/$index.log"
  code=${PIPESTATUS[0]}
  took=$(($(date +%s) - started))
  names+=("$name")
  seconds+=("$took")
  if [ "$code" -eq 0 ]; then
    results+=("passed")
  else
    results+=("FAILED (exit $code)")
    [ "$first_failure" -ne 0 ] || first_failure=$code
  fi
  echo "== make $target: $name ${results[-1]} in ${took} s"
  if [ "$code" -ne 0 ] && [ "$name" = setup ]; then
    echo "== make $target: setup failed; the other stages need it and were not run"
    break
  fi
done

echo
echo "make $target: stages"
all=0
for i in "${!names[@]}"; do
  printf '  %-14s %-20s %6s s\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}"
  all=$((all + seconds[i]))
done
printf '  %-14s %-20s %6s s\n' "all" "" "$all"
failed=()
for i in "${!names[@]}"; do
  [ "${results[$i]}" = passed ] || failed+=("${names[$i]}")
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "make $target: ${#failed[@]} stage(s) failed: ${failed[*]}"
else
  echo "make $target: every stage passed"
fi
# pytest's closing lines last, in stage order: how many tests ran is what a reader looks for.
for i in $(seq "$index"); do
  grep -E '^(=+ )?([0-9]+ (passed|failed|errors?|skipped)|no tests ran).* in [0-9.]+s' \
    "$logdir/$i.log" | tail -n 1
done
exit "$first_failure"
