#!/usr/bin/env bash
# The PyTorch package on the GPU machine in one call (issue 12's checks): builds it against the
# machine's torch and compilers (`pip install --no-build-isolation`, into a scratch folder, not
# the environment), runs python/tests, then python/bench_overhead.py (per-call cost on tiny
# shapes beside torch's SDPA backends) and python/bench_hf.py (Hugging Face training steps).
# Logs and JSON go to $OUT: steps.log, build.log, pytest.log, overhead.log, overhead.json,
# hf.log, hf.json (7 files). Each step has a time limit (together 9.8 minutes, under the
# 10-minute limit of one device call); the whole should take 5 to 8 minutes on one H200, most
# of it the build (for sm_90a only unless TORCH_CUDA_ARCH_LIST says otherwise; MAX_JOBS
# defaults to the core count).
# Usage, from the repository root:  python/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/memeff-gpu-check}"
mkdir -p "$out"
site="$(mktemp -d)/site"
step() { echo "== $* ($(date +%T))" | tee -a "$out/steps.log" >&2; }
status() { echo "   $1 exit $2" | tee -a "$out/steps.log" >&2; }

step "device and software"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch",
torch.__version__, "transformers", transformers.__version__, "cuda", torch.version.cuda)'
  git log --oneline -1
} 2>&1 | tee -a "$out/steps.log"

# sm_90a code only (the H200's; both CUDA backends run on it), about half the build time of the
# default sm_80 + sm_90a + PTX set. Set TORCH_CUDA_ARCH_LIST to build others.
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0a}" MAX_JOBS="${MAX_JOBS:-$(nproc)}"
step "build and install the extension into $site (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
timeout 280 python3 -m pip install --no-build-isolation --no-deps --target "$site" ./python \
  > "$out/build.log" 2>&1
rc=$?
status build "$rc"
if [ "$rc" -ne 0 ]; then
  tail -n 40 "$out/build.log" >&2
  exit 1
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step "pytest python/tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider python/tests > "$out/pytest.log" 2>&1
status pytest "$?"
tail -n 15 "$out/pytest.log"

step "python/bench_overhead.py"
timeout 80 python3 python/bench_overhead.py --json "$out/overhead.json" > "$out/overhead.log" 2>&1
status bench_overhead "$?"
grep -A 20 '^| shape' "$out/overhead.log"

step "python/bench_hf.py"
timeout 80 python3 python/bench_hf.py --json "$out/hf.json" > "$out/hf.log" 2>&1
status bench_hf "$?"
grep -E '^(#|\|)' "$out/hf.log"
step "done"
