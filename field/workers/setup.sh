#!/usr/bin/env bash
# Install what the worker harness needs beyond field/setup.sh's vllm-nixl package
# directory: field/workers/requirements.txt into .venv-field/engines/workers (--no-deps,
# re-installed only when the file changes, as field/setup.sh does for the engines).
set -euo pipefail

VENV=${VENV_FIELD:-.venv-field}
field/setup.sh vllm-nixl
req=field/workers/requirements.txt
dir=$VENV/engines/workers
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ "$(cat "$dir/.stamp" 2>/dev/null)" != "$want" ]; then
  echo "field: installing the worker harness's packages into $dir" >&2
  rm -rf "$dir"
  "$VENV/bin/python" -m pip --disable-pip-version-check -q install --no-deps --no-compile \
    --target "$dir" -r "$req"
  echo "$want" > "$dir/.stamp"
fi
