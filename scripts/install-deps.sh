#!/usr/bin/env bash
# Installs what building and testing memeff needs on a Debian/Ubuntu machine, and nothing that
# is already there (clang and libomp-dev serve the sanitized and fuzz builds of
# scripts/ci-extra.sh). CUDA is optional: with nvcc on the PATH the GPU backends build too.
set -euo pipefail

packages=(cmake ninja-build g++ make libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
          nlohmann-json3-dev libcli11-dev clang libomp-dev python3)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: nvcc found in /usr/local/cuda/bin; add it to PATH to build the CUDA backends" >&2
fi
