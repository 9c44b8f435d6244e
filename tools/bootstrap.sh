#!/usr/bin/env bash
# Create or refresh the project's virtual environment: torch first (the right build,
# see tools/install_torch.sh), then kvspec, editable, with its test dependencies.
set -euo pipefail

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
export VENV

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$(dirname "$0")/install_torch.sh"

stamp="$VENV/.deps-stamp"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing kvspec and its test dependencies" >&2
  "$VENV/bin/python" -m pip --disable-pip-version-check -q install -e '.[dev]'
  touch "$stamp"
fi
