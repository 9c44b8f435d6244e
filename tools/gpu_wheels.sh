#!/usr/bin/env bash
# Wheels for a GPU machine that reaches no package index (the device tool's nvidia-h200:
# Python 3.12 with torch, numpy, safetensors, hypothesis and pytest with xdist and
# timeout, but no pyzmq, multiprocess, dill or crc32c). Writes them into .whl/ (ignored
# by git), at the versions this venv runs, with kvspec's own wheel (for its pytest
# plugin's entry point); tools/gpu_check.sh installs them there. See docs/gpu.md.
#
#   tools/gpu_wheels.sh                 for Python 3.12 on x86-64 Linux
#   PYVER=3.11 tools/gpu_wheels.sh      for another Python
#   DEST=w tools/gpu_wheels.sh          into w/ (gpu_check.sh then needs WHEELS=w)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
PYVER=${PYVER:-3.12}
DEST=${DEST:-.whl}
NEEDED=(pyzmq multiprocess dill crc32c)

pins=()
for name in "${NEEDED[@]}"; do
  version=$("$PY" -c "from importlib.metadata import version; print(version('$name'))") || {
    echo "gpu_wheels: $PY has no $name; run make setup first" >&2
    exit 1
  }
  pins+=("$name==$version")
done

fresh=$(mktemp -d "${TMPDIR:-/tmp}/kvspec-wheels-XXXXXX")  # $DEST stays as it was until all came
trap 'rm -rf "$fresh"' EXIT
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_17 manylinux2014 \
  manylinux_2_5 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --implementation cp \
  --python-version "$PYVER" "${platforms[@]}" -d "$fresh" "${pins[@]}"
"$PY" -m pip wheel -q --no-deps -w "$fresh" .
rm -rf "$DEST"
mkdir -p "$DEST"
mv "$fresh"/*.whl "$DEST"/
echo "gpu_wheels: $(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1), in $DEST:"
ls "$DEST" | sed 's/^/  /'
