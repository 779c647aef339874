#!/usr/bin/env bash
# One call on the GPU machine: the gpu-labelled tests, compute-sanitizer on small cases of each
# CUDA backend, the main job, the soak run (tests/soak), then `memeff bench` (the default
# dispatch, and the mma.sync `cuda` backend alone as the baseline) and PyTorch's SDPA backends
# (bench/torch_sdpa.py, a copy of the project's peer script) on the anchor shapes plus GQA 4:1,
# head dim 96 and 256 in the same call, and an autotune demonstration.
# Usage: bench/gpu_session.sh BUILD_DIR TORCH_SCRIPT   (logs and JSON rows go to $OUT)
# SKIP_CPU=1 skips the CPU comparison, SKIP_TUNE=1 the autotune demonstration; TORCH_BACKENDS
# (default "flash cudnn") picks the peers; BASELINE_BIN=DIR (an older build) benches it beside
# this one, twice each, in the same call. SKIP_CHECKS=1 skips the tests, sanitizers and runs
# (a second call on a warm machine that only measures), SKIP_BENCH=1 everything after them;
# SKIP_SOAK=1 skips the soak run, SOAK_CALLS=N sets its calls (default 10000), SKIP_SPLITKV=1 the
# decode shapes of bench/splitkv_decode.sh. bench/gpu_python.sh
# is the PyTorch package's half.
set -uo pipefail
# Every step has a time limit, so a hang costs that step and not the whole call.
bin="${1:?build dir with tools/memeff, tests/memeff_gpu_tests and tests/soak/memeff_soak}"
torch_script="${2:-}"
out="${OUT:-/tmp/memeff-gpu-session}"
mkdir -p "$out"
step() { echo "== $* ($(date +%T))" | tee -a "$out/steps.log" >&2; }

step "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv |
  tee "$out/device.txt"

if [ -z "${SKIP_CHECKS:-}" ]; then
step "gpu tests (two shards side by side)"
# The whole suite did not finish in 478 s in one process on an H100 (its larger cases check
# against CPU references); two shards of 8 CPU threads each took about 300 s (2026-12-06). Each
# test's result and time is logged, so a run cut short still shows where it was.
for shard in 0 1; do
  (OMP_NUM_THREADS=8 GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$shard timeout 420 \
     "$bin/tests/memeff_gpu_tests" > "$out/gpu_tests_$shard.log" 2>&1
   echo "shard $shard exit $?" >> "$out/gpu_tests_$shard.log") &
done
wait
for shard in 0 1; do
  grep -E "^\[  (PASSED|FAILED) |tests? ran|^shard" "$out/gpu_tests_$shard.log"
done

step "sm_90a code: HGMMA instructions per kernel, registers"
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass "$bin/tests/memeff_gpu_tests" 2>/dev/null |
    awk '/Function :/{f=$3} /HGMMA/{c[f]++} END{for(k in c) print c[k], k}' | sort -k2 > "$out/hgmma.txt"
  cuobjdump -res-usage "$bin/tests/memeff_gpu_tests" 2>/dev/null | grep -A1 sm90 > "$out/res_usage.txt"
  echo "$(wc -l < "$out/hgmma.txt") kernels with HGMMA"
fi

fwd='Backends/CudaForward' bwd='Backends/CudaBackward'
small="DropoutFragment.*:$fwd.NoKeysGiveZeroOutAndMinusInfLse/*:$fwd.GroupedAndMultiQueryAttention/*"
small+=":$fwd.AwkwardLengthsSquare/cuda_sm90:$fwd.BiasBroadcastEachWayBothDtypes/cuda_sm90"
small+=":$bwd.SeedAndOffsetFromDeviceMemory/*:$bwd.BlhdStridesAndHalf/cuda_sm90"
small+=":$bwd.DeterministicIsBitwiseRepeatable/cuda_sm90:$bwd.SingleVisibleKeyGivesExactlyZeroDs/cuda_sm90"
small+=":CudaMath.RowsWithoutKeysGiveZeroAndMinusInfinity"
# The packed and global-coordinate paths.
small+=":Backends/CudaPacked.BadOffsetsOnTheDeviceAreNamed/*:Backends/CudaPacked.KeysOfOtherLengths*/*"
small+=":Backends/CudaGlobalCoordinates.KeyStartsOffTheDropoutBlocks/*"
# The window's kernels of both fused backends: tiles it cuts, rows it leaves without a key.
small+=":Backends/CudaWindow.RowsWithoutAVisibleKey/*"
# The split-KV forward: every instantiation with dropout, rows without keys, strides.
small+=":CudaSplitKv.DropoutMaskIsTheDocumentedOneElementByElement"
small+=":CudaSplitKv.RowsWithoutKeysGiveZeroAndMinusInf:CudaSplitKv.BlhdStridesScalesAndUnequalHeadDims"
for tool in memcheck racecheck synccheck; do
  step "compute-sanitizer $tool"
  timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$bin/tests/memeff_gpu_tests" --gtest_brief=1 --gtest_filter="$small" > "$out/sanitizer_$tool.log" 2>&1
  echo "$tool exit $? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|tests? ran|PASSED|FAILED' "$out/sanitizer_$tool.log" | tr '\n' ' ')"
done

step "memeff run (defaults)"
timeout 60 "$bin/tools/memeff" run 2>&1 | tee "$out/run.log"
# Packed sequences and context parallelism on one GPU, each checked by the program against the
# reference / the single-device run.
step "memeff run --seqlens (packed), --context-parallel 4 --cp-transport local"
timeout 60 "$bin/tools/memeff" run --device cuda \
  --seqlens 17,512,1000,3000,1 --dropout 0.1 2>&1 | tee "$out/run_packed.log"
for n in 2 4; do
  timeout 60 "$bin/tools/memeff" run --device cuda \
    --context-parallel $n --cp-transport local 2>&1 | tee -a "$out/run_cp.log"
done

# The soak run (docs/testing.md): 10,000 random calls on the fused backends, every 10th checked
# against the reference, free device memory and host RSS read after 100 calls and at the end.
if [ -z "${SKIP_SOAK:-}" ]; then
  step "soak: ${SOAK_CALLS:-10000} random calls on cuda and cuda_sm90, every 10th checked, memory before and after"
  timeout 420 "$bin/tests/soak/memeff_soak" --backend auto --calls "${SOAK_CALLS:-10000}" \
    --check-every 10 --max-seconds 360 > "$out/soak.log" 2>&1
  echo "soak exit $?"
  tail -n 14 "$out/soak.log"
fi

fi  # SKIP_CHECKS
if [ -n "${SKIP_BENCH:-}" ]; then step "done"; exit 0; fi

shapes=(32,12,512,512,64,0 8,16,2048,2048,128,0 8,16,2048,2048,128,1 4,32,4096,4096,64,1
        1,16,16384,16384,128,1 8,32,2048,2048,128,0,8 8,16,2048,2048,96,0 4,16,2048,2048,256,0)
step "memeff bench (default dispatch; anchor shapes, GQA, hd96, hd256; dropout 0 and 0.1)"
timeout 200 "$bin/tools/memeff" bench --shapes "${shapes[@]}" --json "$out/memeff_bench.json" \
  2>"$out/bench_progress.log" | tee "$out/bench.log"
if [ -n "${BASELINE_BIN:-}" ]; then
  # An older build's `memeff bench` on the same shapes, then both once more: old against new in
  # one call, with each one's own spread beside it (compare.py --baseline joins the pairs).
  for round in 1 2; do
    step "memeff bench, older build $BASELINE_BIN (round $round)"
    timeout 200 "$BASELINE_BIN/tools/memeff" bench --shapes "${shapes[@]}" \
      --json "$out/memeff_base_$round.json" 2>>"$out/bench_progress.log" | tee "$out/bench_base_$round.log"
    if [ "$round" = 1 ]; then
      step "memeff bench, this build (round 2)"
      timeout 200 "$bin/tools/memeff" bench --shapes "${shapes[@]}" \
        --json "$out/memeff_bench_2.json" 2>>"$out/bench_progress.log" | tee "$out/bench_2.log"
    fi
  done
fi
step "memeff bench --backend cuda (the mma.sync kernels, baseline)"
timeout 200 "$bin/tools/memeff" bench --backend cuda --shapes "${shapes[@]}" --json "$out/memeff_sm80.json" \
  2>>"$out/bench_progress.log" | tee "$out/bench_sm80.log"

if [ -n "$torch_script" ]; then
  step "PyTorch SDPA backends, same shapes"
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 timeout 300 python3 "$torch_script" --shapes "${shapes[@]}" \
    --backends ${TORCH_BACKENDS:-flash cudnn} --json "$out/torch.json" 2>&1 | tee "$out/torch.log"
fi

if [ -s "$out/torch.json" ]; then
  step "side-by-side table"
  python3 "$(dirname "$0")/compare.py" "$out/memeff_bench.json" "$out/torch.json" \
    --baseline "$out/memeff_sm80.json" --markdown "$out/table.md" --plot "$out/anchors.png"
  if [ -s "$out/memeff_base_1.json" ]; then
    step "this build beside the older one (two rounds each)"
    python3 "$(dirname "$0")/compare.py" "$out/memeff_bench.json" "$out/torch.json" \
      --baseline "$out/memeff_base_1.json" --markdown "$out/table_vs_base_1.md"
    python3 "$(dirname "$0")/compare.py" "$out/memeff_bench_2.json" "$out/torch.json" \
      --baseline "$out/memeff_base_2.json" --markdown "$out/table_vs_base_2.md"
  fi
fi

if [ -z "${SKIP_SPLITKV:-}" ]; then
  step "decode shapes: the split-KV forward on and off, PyTorch's SDPA (bench/splitkv_decode.sh)"
  timeout 900 "$(dirname "$0")/splitkv_decode.sh" "$out/splitkv" "$bin" 2>&1 | tail -n 12
fi

if [ -n "${SKIP_TUNE:-}" ]; then step "done"; exit 0; fi
step "autotune demonstration"
export MEMEFF_CACHE_DIR="$out/tune-cache"
printf '%s\n' '1,4,4,32,32,64,64,none,0.1,bf16' '16,16,16,64,64,64,64,top_left,0.1,bf16' \
  '1,8,8,2048,2048,128,128,top_left,0.1,fp32' > "$out/tune_shapes.txt"
timeout 90 "$bin/tools/memeff" tune --device cuda --shapes "$out/tune_shapes.txt" 2>&1 | tee "$out/tune.log"
"$bin/tools/memeff" tune --show 2>&1 | tee -a "$out/tune.log"
"$bin/tools/memeff" explain --device cuda --batch 1 --heads 4 --lq 32 --lk 32 --dtype bf16 2>&1 | tee -a "$out/tune.log"
cpu_torch_script="$(dirname "$torch_script")/torch_sdpa_cpu.py"
if [ -z "${SKIP_CPU:-}" ] && [ -n "$torch_script" ] && [ -f "$cpu_torch_script" ] &&
  command -v taskset >/dev/null; then
  step "CPU: the cpu backend and PyTorch's CPU SDPA, pinned to cores 0,1"
  for threads in 1 2; do
    OMP_NUM_THREADS=$threads timeout 120 taskset -c 0,1 "$bin/tools/memeff" bench --device cpu \
      --json "$out/memeff_cpu_t$threads.json" 2>>"$out/bench_progress.log" | tee "$out/cpu_t$threads.log"
  done
  PYTHONUNBUFFERED=1 timeout 200 taskset -c 0,1 python3 "$cpu_torch_script" 2>&1 | tee "$out/torch_cpu.log"
fi
step "done"
