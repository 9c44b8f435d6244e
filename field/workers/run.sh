#!/usr/bin/env bash
# The worker harness in `make field` (field/run.sh): vLLM 0.33.0's NixlConnector workers
# move KV between two TPs over NIXL on CPU (field/workers/vllm_nixl.py). Writes
# reports/field/vllm-nixl.workers.json, which the report builder (python -m field.report)
# reads, and the engines' logs beside it.
# Exit status: 0 every case moved and verified, 1 a case did not (a result to report),
# anything else the harness failed.
set -euo pipefail

VENV=${VENV_FIELD:-.venv-field}
OUT=${OUT:-reports/field}
field/workers/setup.sh
mkdir -p "$OUT"
echo "field: vLLM NIXL workers (field/workers/vllm_nixl.py)" >&2
PYTHONPATH=$VENV/engines/workers:$VENV/engines/vllm-nixl timeout 2400 "$VENV/bin/python" \
  field/workers/vllm_nixl.py --json "$OUT/vllm-nixl.workers.json" --logs "$OUT/workers" \
  "$@" > "$OUT/vllm-nixl.workers.log" 2>&1
