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
  # The optional one-sided transports (sim/paths/nixl.py, sim/paths/mooncake.py: the kvspec[nixl] and
  # kvspec[mooncake] extras), without their dependencies: NIXL's would replace torch with
  # a multi-GB CUDA build, and the engines need none of theirs. Where one cannot be
  # installed, its tests skip and say why.
  for extra in nixl mooncake; do
    wheel=$(sed -n "s/^$extra = \\[\"\\(.*\\)\"\\]\$/\\1/p" pyproject.toml)
    if [ -n "$wheel" ] && ! "$VENV/bin/python" -m pip --disable-pip-version-check -q install --no-deps "$wheel"; then
      echo "bootstrap: $wheel did not install; --transport $extra and its tests are skipped" >&2
    fi
  done
  # Mooncake's engine links libibverbs even for TCP: install Debian's where this is root on
  # a Debian-like machine (a fresh CI machine), so its path is tested, not skipped.
  if ! "$VENV/bin/python" -c 'import mooncake.engine' 2>/dev/null \
      && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "bootstrap: installing libibverbs1 for the Mooncake engine" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libibverbs1 >/dev/null 2>&1 \
      || (apt-get update -q >/dev/null 2>&1 \
          && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libibverbs1 >/dev/null 2>&1) \
      || true
  fi
  if ! "$VENV/bin/python" -c 'import mooncake.engine' 2>/dev/null; then
    echo "bootstrap: the Mooncake engine does not load (it needs libibverbs1: apt-get install libibverbs1); --transport mooncake and its tests are skipped" >&2
  fi
  touch "$stamp"
fi
