#!/usr/bin/env bash
# Build .venv-field: one environment (torch CPU build + kvspec) and, for each field
# engine, its own package directory installed from field/requirements/ENGINE.txt with
# --no-deps (the engines' declared dependencies pull CUDA builds; their mapping modules
# need far less, see field/NOTES.md). `make field` runs each adapter with its engine's
# directory first on PYTHONPATH, so two vLLM versions can be checked side by side.
#
# usage: field/setup.sh [ENGINE ...]   (default: every $FIELD_REQUIREMENTS/*.txt)
# FIELD_REQUIREMENTS names the directory of requirements files (default field/requirements;
# the historical corpus keeps one file per engine release in field/history/requirements).
# Re-running reinstalls only what changed (a requirements file or the torch spec).
set -euo pipefail

VENV=${VENV_FIELD:-.venv-field}
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0+cpu}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
REQUIREMENTS=${FIELD_REQUIREMENTS:-field/requirements}

engines=("$@")
if [ ${#engines[@]} -eq 0 ]; then
  for f in "$REQUIREMENTS"/*.txt; do engines+=("$(basename "$f" .txt)"); done
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }

if [ "$(cat "$VENV/.torch-spec" 2>/dev/null)" != "$TORCH" ] \
   || ! "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
  echo "field: installing $TORCH" >&2
  pip install "$TORCH" || pip install "$TORCH" --extra-index-url "$TORCH_INDEX"
  echo "$TORCH" > "$VENV/.torch-spec"
fi
if [ ! -f "$VENV/.kvspec-stamp" ] || [ pyproject.toml -nt "$VENV/.kvspec-stamp" ]; then
  echo "field: installing kvspec (no test dependencies)" >&2
  pip install -e .
  touch "$VENV/.kvspec-stamp"
fi

# The pins of a requirements file, comments and order aside: engines whose pins are the
# same (the vLLM 0.33.0 adapters) share one package directory, linked by name.
pins() { sed 's/#.*//; s/[[:space:]]*$//' "$1" | grep -v '^$' | sort | sha256sum | cut -d' ' -f1; }

for engine in "${engines[@]}"; do
  req=$REQUIREMENTS/$engine.txt
  dir=$VENV/engines/$engine
  [ -f "$req" ] || { echo "field: no $req" >&2; exit 2; }
  want=$(sha256sum "$req" | cut -d' ' -f1)
  key=$(pins "$req")
  if [ -L "$dir" ]; then
    [ "$(cat "$dir/.pins" 2>/dev/null)" = "$key" ] && continue
    rm -f "$dir"
  fi
  if [ "$(cat "$dir/.stamp" 2>/dev/null)" != "$want" ]; then
    shared=""
    for other in "$VENV"/engines/*; do
      if [ -d "$other" ] && [ ! -L "$other" ] && [ "$other" != "$dir" ] \
         && [ "$(cat "$other/.pins" 2>/dev/null)" = "$key" ]; then
        shared=$(basename "$other") && break
      fi
    done
    rm -rf "$dir"
    if [ -n "$shared" ]; then
      echo "field: $engine shares $shared's packages (the same pins)" >&2
      ln -s "$shared" "$dir"
      continue
    fi
    echo "field: installing $engine into $dir" >&2
    pip install --no-deps --no-compile --target "$dir" -r "$req"
    echo "$want" > "$dir/.stamp"
  fi
  echo "$key" > "$dir/.pins"
done
