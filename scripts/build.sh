#!/usr/bin/env bash
# Configures and builds memeff in ./build (or $MEMEFF_BUILD_DIR), installing missing Debian
# packages first. The CUDA backends build when nvcc is found (PATH or /usr/local/cuda/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
build_dir="${MEMEFF_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >&2
cmake --build "$build_dir" >&2
