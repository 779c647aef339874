#!/usr/bin/env bash
# Builds memeff and runs every test. Tests labelled gpu skip themselves without a CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir "${MEMEFF_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
