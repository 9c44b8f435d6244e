#!/usr/bin/env bash
# `make field`: build .venv-field, run every field adapter through the conformance suite,
# replay the targeted examples, run the repro scripts, and rewrite docs/field-report.md.
#
# usage: field/run.sh [ENGINE ...]      (default: every field/requirements/*.txt)
# Environment: CONFORM_JSON  the conform option that writes the JSON report (--json)
#              PROFILE       the Hypothesis profile (ci)
# Exit status: 0 when every failure is triaged (field/triage.json), 1 otherwise.
set -euo pipefail

VENV=${VENV_FIELD:-.venv-field}
CONFORM_JSON=${CONFORM_JSON:---json}
PROFILE=${PROFILE:-ci}
OUT=reports/field
started=$(date +%s)

engines=("$@")
if [ ${#engines[@]} -eq 0 ]; then
  for f in field/requirements/*.txt; do engines+=("$(basename "$f" .txt)"); done
fi

field/setup.sh "${engines[@]}"
mkdir -p "$OUT"
echo '{}' > "$OUT/repro.json"

for engine in "${engines[@]}"; do
  path=$VENV/engines/$engine
  echo "field: kvspec conform $engine --profile $PROFILE" >&2
  # Engines log to stdout and stderr; the table goes to ENGINE.txt, the logs to ENGINE.log.
  rc=0
  PYTHONPATH=$path timeout 1200 "$VENV/bin/kvspec" conform "$engine" --profile "$PROFILE" \
    --quiet "$CONFORM_JSON" "$OUT/$engine.json" > "$OUT/$engine.txt" 2> "$OUT/$engine.log" || rc=$?
  # 0 passed, 1 a check failed, 3 a check was inconclusive: all are results to report.
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ] && [ "$rc" -ne 3 ]; then
    echo "field: kvspec conform $engine exited $rc (see $OUT/$engine.log)" >&2
    tail -5 "$OUT/$engine.log" >&2
    exit "$rc"
  fi
  if [ -f "field/replays/$engine.json" ]; then
    PYTHONPATH=$path "$VENV/bin/python" field/replays.py "$engine" "$OUT/$engine.replays.json" \
      >> "$OUT/$engine.log" 2>&1
  fi
  for script in field/repro/"$engine"/[a-z]*.py; do
    [ -f "$script" ] || continue
    rc=0
    PYTHONPATH=$path timeout 300 "$VENV/bin/python" "$script" >> "$OUT/$engine.log" 2>&1 || rc=$?
    "$VENV/bin/python" - "$OUT/repro.json" "$script" "$rc" <<'EOF'
import json, sys
path, script, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = json.load(open(path))
data[script] = rc
json.dump(dict(sorted(data.items())), open(path, "w"), indent=2)
EOF
  done
done

minutes=$(( ($(date +%s) - started + 30) / 60 ))
echo "{\"minutes\": $minutes}" > "$OUT/run.json"
"$VENV/bin/kvspec" field-report --reports "$OUT" --triage field/triage.json \
  --out docs/field-report.md
