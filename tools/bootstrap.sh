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
  # The optional NIXL transport (sim/nixl.py, the kvspec[nixl] extra), without its
  # dependencies: they would replace torch with a multi-GB CUDA build. Where it cannot be
  # installed, its tests skip and say why.
  nixl=$(sed -n 's/^nixl = \["\(.*\)"\]$/\1/p' pyproject.toml)
  if [ -n "$nixl" ] && ! "$VENV/bin/python" -m pip --disable-pip-version-check -q install --no-deps "$nixl"; then
    echo "bootstrap: $nixl did not install; --transport nixl and its tests are skipped" >&2
  fi
  touch "$stamp"
fi
