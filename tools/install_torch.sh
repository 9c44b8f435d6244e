#!/usr/bin/env bash
# Install torch into the virtual environment $VENV, the right build for this machine.
#
# A bare `torch` requirement resolves to a multi-GB CUDA build on Linux, so torch is
# installed first and on its own: without a GPU the CPU build (`+cpu`), which pip finds
# in a local wheel directory or on PyTorch's CPU index; with a GPU, the default PyPI
# build. Override with TORCH='torch==2.5.1' TORCH_INDEX=https://download.pytorch.org/whl/cu121.
# The chosen spec is remembered in $VENV/.torch-spec: change it and the next run
# reinstalls torch; leave it and nothing is downloaded again. TORCH_PIP_ARGS adds pip
# options (the wheel smoke passes --no-compile: its venv lives for one run).
set -euo pipefail
: "${VENV:?VENV must name the virtual environment}"

if nvidia-smi -L >/dev/null 2>&1; then have_gpu=1; else have_gpu=0; fi
if [ -z "${TORCH:-}" ]; then
  if [ "$have_gpu" = 1 ]; then TORCH='torch==2.13.0'; else TORCH='torch==2.13.0+cpu'; fi
fi
if [ -z "${TORCH_INDEX:-}" ] && [ "$have_gpu" = 0 ]; then
  TORCH_INDEX=https://download.pytorch.org/whl/cpu
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" ${TORCH_PIP_ARGS:-}; }

spec_file="$VENV/.torch-spec"
# The installed distribution is asked, not imported: importing torch costs seconds of CPU
# (and, on a busy machine, tens of seconds) on every `make run`.
if [ "$(cat "$spec_file" 2>/dev/null)" != "$TORCH|${TORCH_INDEX:-}" ] \
   || ! "$VENV/bin/python" -c 'from importlib.metadata import version; version("torch")' \
        >/dev/null 2>&1; then
  echo "install_torch: installing $TORCH into $VENV (gpu=$have_gpu)" >&2
  # A local wheel or the default index first; the extra index only if needed,
  # so a machine without access to it still works when the wheel is at hand.
  if ! pip install "$TORCH"; then
    [ -n "${TORCH_INDEX:-}" ] || exit 1
    pip install "$TORCH" --extra-index-url "$TORCH_INDEX"
  fi
  echo "$TORCH|${TORCH_INDEX:-}" > "$spec_file"
fi
