#!/usr/bin/env bash
# CI beyond scripts/test.sh (run after it; .ci/run calls both): (1) the CPU library, program and
# unit tests built with clang under AddressSanitizer + UBSan and run; (2) the libFuzzer target
# (tests/fuzz) for MEMEFF_FUZZ_SECONDS (default 60) from the corpus in the repo, in the same
# sanitized build; (3) the CPU library and unit tests under ThreadSanitizer (the concurrency
# stress among them); (4) the normal build installed to a fresh prefix, and examples/cpp built
# against it and run; then the same with a CPU-only shared library (-DBUILD_SHARED_LIBS=ON).
# Build folders: build-sanitize/, build-tsan/, build-shared/ (or under $MEMEFF_CI_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build_dir="${MEMEFF_BUILD_DIR:-build}"
ci_dir="${MEMEFF_CI_DIR:-.}"
jobs="$(nproc)"
step() { echo "== ci-extra: $* ($(date +%T))" >&2; }

step "sanitized CPU build (clang, ASan + UBSan)"
san="$ci_dir/build-sanitize"
sanitizers="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
CC=clang CXX=clang++ cmake -S . -B "$san" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMEMEFF_CUDA=OFF -DMEMEFF_BUILD_BENCH=OFF -DMEMEFF_INSTALL=OFF -DMEMEFF_BUILD_FUZZ=ON \
  "-DCMAKE_CXX_FLAGS=$sanitizers -fsanitize=fuzzer-no-link" \
  "-DCMAKE_EXE_LINKER_FLAGS=$sanitizers" >&2
cmake --build "$san" -j "$jobs" >&2
step "unit tests under ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir "$san" -L unit --output-on-failure -j "$jobs"

step "fuzzing ${MEMEFF_FUZZ_SECONDS:-60} s from tests/fuzz/corpus"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$san/fuzz-artifacts"
# New inputs go to the scratch folder (the first one); the repository's corpus is only read.
"$san/tests/fuzz/memeff_attention_fuzz" "$work/corpus" tests/fuzz/corpus \
  -max_total_time="${MEMEFF_FUZZ_SECONDS:-60}" -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$san/fuzz-artifacts/" -print_final_stats=1 2>"$work/fuzz.log" || {
  tail -60 "$work/fuzz.log" >&2
  echo "ci-extra: the fuzz target failed; the input is in $san/fuzz-artifacts/" >&2
  exit 1
}
grep -E "stat::number_of_executed_units|stat::new_units_added" "$work/fuzz.log" >&2

step "ThreadSanitizer CPU build (clang, LLVM's libomp with Archer)"
# Every target the unit-labelled tests run (the library, the unit tests with the concurrency
# stress, the program for the cli.* tests, the soak): the default targets of a CPU-only build
# without fuzz target and benchmarks, so a new unit-labelled test cannot find its program missing.
tsan="$ci_dir/build-tsan"
CC=clang CXX=clang++ cmake -S . -B "$tsan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMEMEFF_CUDA=OFF -DMEMEFF_BUILD_BENCH=OFF -DMEMEFF_INSTALL=OFF -DMEMEFF_BUILD_FUZZ=OFF \
  "-DCMAKE_CXX_FLAGS=-fsanitize=thread" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread" >&2
cmake --build "$tsan" -j "$jobs" >&2
# The OpenMP runtime is not built with TSan, so its barriers and hand-offs are invisible to it and
# every parallel region would be reported as a race. Archer (libarcher.so, shipped beside LLVM's
# libomp) is the OpenMP tool that tells TSan about them: loaded through OMP_TOOL_LIBRARIES, with
# ignore_noninstrumented_modules=1 (Archer's advice) so TSan skips the runtime's own internals.
# memeff's OpenMP regions stay checked, with their threads. TSan does not see 32- and 64-byte
# vector accesses, so the cpu backend runs its scalar kernels here (MEMEFF_CPU_ISA=scalar): the
# same threads, tiles and buffers as the AVX2/AVX-512 tables, every access visible.
omp_lib="$(sed -n 's/^OpenMP_omp_LIBRARY:FILEPATH=//p' "$tsan/CMakeCache.txt")"
archer="$(dirname "${omp_lib:-/nonexistent}")/libarcher.so"
if [ ! -f "$archer" ]; then
  echo "ci-extra: no libarcher.so beside the OpenMP runtime (${omp_lib:-none found}); install libomp-dev" >&2
  exit 1
fi
step "unit tests under ThreadSanitizer"
OMP_TOOL_LIBRARIES="$archer" MEMEFF_CPU_ISA=scalar \
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1" \
  ctest --test-dir "$tsan" -L unit --output-on-failure -j "$jobs"

example() {  # example PREFIX BUILD: the example against an installed memeff, built and run
  cmake -S examples/cpp -B "$2" -G Ninja -DCMAKE_PREFIX_PATH="$1" >&2
  cmake --build "$2" >&2
  "$2/attention_example"
}
step "install of $build_dir to a fresh prefix, examples/cpp against it"
cmake --install "$build_dir" --prefix "$work/prefix" >&2
"$work/prefix/bin/memeff" --version
example "$work/prefix" "$work/example"

step "CPU-only shared library: install, examples/cpp against it"
shared="$ci_dir/build-shared"
cmake -S . -B "$shared" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DMEMEFF_CUDA=OFF -DMEMEFF_BUILD_TESTS=OFF -DMEMEFF_BUILD_BENCH=OFF >&2
cmake --build "$shared" -j "$jobs" >&2
cmake --install "$shared" --prefix "$work/prefix-shared" >&2
"$work/prefix-shared/bin/memeff" --version
example "$work/prefix-shared" "$work/example-shared"
step "done"
