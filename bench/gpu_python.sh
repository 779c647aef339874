#!/usr/bin/env bash
# The PyTorch package's half of a GPU-machine call: build memeff's extension against the machine's
# torch (pip, all cores), run its test suite, then issue 11's accuracy grid (python/accuracy_grid.py,
# the same grid the suite asserts) and the package's benchmarks. Logs and JSON go to $OUT.
# Usage: bench/gpu_python.sh      (from the repository root; SKIP_BENCH=1 stops after the grid)
# The extension is built for sm_90a alone (TORCH_CUDA_ARCH_LIST=9.0a, a third of the full build's
# compile time) unless TORCH_CUDA_ARCH_LIST says otherwise. With PACK=FILE.tgz the logs are packed
# there after every step, so a call cut short still returns what ran.
set -uo pipefail
out="${OUT:-/tmp/memeff-gpu-python}"
mkdir -p "$out"
site="${MEMEFF_SITE:-/tmp/memeff-site}"
step() {
  if [ -n "${PACK:-}" ]; then tar czf "$PACK" -C "$(dirname "$out")" "$(basename "$out")"; fi
  echo "== $* ($(date +%T))" | tee -a "$out/steps.log" >&2
}
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0a}"

step "build the package (MAX_JOBS=$(nproc))"
MAX_JOBS="$(nproc)" timeout 300 python3 -m pip install --quiet --no-build-isolation --no-deps \
  --target "$site" ./python > "$out/pip.log" 2>&1
echo "pip exit $?"; tail -n 5 "$out/pip.log"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

step "accuracy grid (issue 11)"
PYTHONUNBUFFERED=1 timeout 200 python3 python/accuracy_grid.py --device cuda --json "$out/accuracy_grid.json" \
  2> "$out/accuracy_progress.log" | tee "$out/accuracy_grid.md"

step "pytest python/tests"
# The accuracy grid's points ran above through python/accuracy_grid.py (the same measure and
# bars, with the table); here the rest of the suite.
PYTHONUNBUFFERED=1 timeout 300 python3 -m pytest -q --durations=5 python/tests \
  -k "not test_errors_within_pytorch_bars" > "$out/pytest.log" 2>&1
echo "pytest exit $?"; tail -n 12 "$out/pytest.log"

if [ -z "${SKIP_BENCH:-}" ]; then
  for script in python/bench_train.py python/bench_overhead.py python/bench_hf.py \
                python/bench_varlen.py; do
    [ -f "$script" ] || continue
    step "$script"
    PYTHONUNBUFFERED=1 timeout 120 python3 "$script" --json "$out/$(basename "$script" .py).json" \
      2>&1 | tee "$out/$(basename "$script" .py).log" | tail -n 20
  done
fi
step "done"
