#!/usr/bin/env bash
# Builds memeff and runs the main job: `memeff run` (GPU when present, else CPU). Extra
# arguments go to `memeff run` (see `memeff run --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec "${MEMEFF_BUILD_DIR:-build}/tools/memeff" run "$@"
