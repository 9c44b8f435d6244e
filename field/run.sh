#!/usr/bin/env bash
# `make field`: build .venv-field, run every field adapter through the conformance suite,
# replay the targeted examples, run the repro scripts and the standalone repros of the
# draft upstream issues (field/upstream/ID.md), run the worker harness (field/workers/),
# run both releases of every bug of the historical corpus (field/history/), and rewrite
# docs/field-report.md and docs/field-report.json from the reports and the ledger
# field/defects.json.
#
# usage: field/run.sh [ENGINE ...]      (default: every field/requirements/*.txt)
# Environment: CONFORM_JSON  the conform option that writes the JSON report (--json)
#              PROFILE       the Hypothesis profile (ci)
#              FIELD_HISTORY 0 skips the historical corpus (1, the default, runs it)
# Exit status: 0 when every failure is triaged in field/defects.json, the run contradicts
# none of its verdicts and every history run produced its report; 1 otherwise.
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

record() {  # record SCRIPT EXIT: a repro's exit status, into $OUT/repro.json
  "$VENV/bin/python" - "$OUT/repro.json" "$1" "$2" <<'EOF'
import json, sys
path, script, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = json.load(open(path))
data[script] = rc
json.dump(dict(sorted(data.items())), open(path, "w"), indent=2)
EOF
}

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
    record "$script" "$rc"
  done
  # Each draft upstream issue's "Standalone repro" block, as a maintainer would paste it
  # (on a CPU-only machine with field/repro/ENGINE/_cpu.py imported first).
  mkdir -p "$OUT/upstream"
  drafts=$("$VENV/bin/python" - "$engine" <<'EOF'
import json, sys
ledger = json.load(open("field/defects.json"))["defects"]
print(" ".join(d["upstream_draft"] for d in ledger.values()
               if d["engine"] == sys.argv[1] and d.get("upstream_draft")))
EOF
  )
  for draft in $drafts; do
    script=$OUT/upstream/$(basename "$draft" .md).py
    "$VENV/bin/python" - "$draft" "$script" <<'EOF'
import re, sys
text = open(sys.argv[1]).read().split("\n## Standalone repro", 1)[1]
open(sys.argv[2], "w").write(re.search(r"```python\n(.*?)```", text, re.S).group(1))
EOF
    rc=0
    PYTHONPATH=$path timeout 300 "$VENV/bin/python" -c '
import runpy, sys
sys.path.insert(0, sys.argv[1])
try:
    import _cpu  # noqa: F401
except ImportError:
    pass
runpy.run_path(sys.argv[2], run_name="__main__")' "field/repro/$engine" "$script" \
      >> "$OUT/$engine.log" 2>&1 || rc=$?
    record "$draft" "$rc"
  done
done

# The worker harness (field/workers/run.sh): vLLM's own NIXL workers move KV between two
# TPs over NIXL on CPU; 0 and 1 (a case did not end as it expects) are results to report.
if [[ " ${engines[*]} " == *" vllm-nixl "* ]]; then
  rc=0
  OUT=$OUT field/workers/run.sh || rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; then
    echo "field: the worker harness exited $rc (see $OUT/vllm-nixl.workers.log)" >&2
    tail -5 "$OUT/vllm-nixl.workers.log" >&2
    exit "$rc"
  fi
fi
# The historical corpus: both releases of each bug an adapter runs, each release in its own
# package directory built from field/history/requirements/RELEASE.txt (field/setup.sh), the
# verdicts judged by the report builder, field/report/ (field/history/README.md).
history_rc=0
if [ "${FIELD_HISTORY:-1}" != 0 ]; then
  releases=$("$VENV/bin/python" - <<'EOF'
import json, pathlib
bugs = [json.loads(p.read_text()) for p in sorted(pathlib.Path("field/history/bugs").glob("*.json"))]
print(" ".join(sorted({b[s]["requirements"] for b in bugs if b["kvspec"].get("adapter")
                       for s in ("buggy", "fixed")})))
EOF
  )
  # shellcheck disable=SC2086  # one word per release
  FIELD_REQUIREMENTS=field/history/requirements field/setup.sh $releases
  "$VENV/bin/python" field/history/run.py --profile "$PROFILE" --out "$OUT/history" \
    --kvspec "$VENV/bin/kvspec" || history_rc=$?
fi

minutes=$(( ($(date +%s) - started + 30) / 60 ))
echo "{\"minutes\": $minutes}" > "$OUT/run.json"
report_rc=0
"$VENV/bin/python" -m field.report --reports "$OUT" --ledger field/defects.json \
  --out docs/field-report.md --json docs/field-report.json || report_rc=$?
[ "$report_rc" -ne 0 ] && exit "$report_rc"
exit "$history_rc"
