#!/usr/bin/env bash
# Builds memeff and runs every test. Tests labelled gpu skip themselves without a CUDA device.
# Where python3 can import torch, it also builds the PyTorch package (python/) into the build
# folder (not into the environment) and runs its pytest suite; elsewhere that suite is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir "${MEMEFF_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"

if python3 -c "import torch" 2>/dev/null; then
  if ! python3 -c "import pytest" 2>/dev/null; then
    echo "torch is importable but pytest is not: python3 -m pip install pytest, then rerun" >&2
    exit 1
  fi
  if ! python3 -c "import hypothesis" 2>/dev/null; then
    echo "hypothesis is not importable: the property tests (python/tests/test_properties.py)" \
         "are skipped (python3 -m pip install hypothesis runs them)" >&2
  fi
  mkdir -p "${MEMEFF_BUILD_DIR:-build}/python-site"
  site="$(cd "${MEMEFF_BUILD_DIR:-build}/python-site" && pwd)"
  echo "== the PyTorch package: pip install --target $site ./python, then pytest python/tests" >&2
  python3 -m pip install --quiet --no-build-isolation --no-deps --upgrade --target "$site" ./python
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -q python/tests
else
  echo "torch is not importable here: the PyTorch package's tests (python/tests) are skipped" >&2
fi
