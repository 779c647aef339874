// Benchmark of the cpu backend (forward, backward) over B·H, L, D, causal and dropout, with the
// reference backend and OpenBLAS's single-thread sgemm (same FLOPs) in the same run as yardsticks.
// FLOPs: forward 4·B·H·Lq·Lk·D (halved when causal), backward 2.5×. Counter "FLOP/s" per row.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "memeff/attention.h"
#include "memeff/tensor.h"

#if defined(MEMEFF_HAVE_OPENBLAS)
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
#endif

namespace {

using memeff::CausalMode;
using memeff::DType;
using memeff::TensorView;

struct Shape {
  std::int64_t BH, L, D;
  bool causal;
  double p;
  int threads;
  bool backward;
  std::string backend;
};

struct Buffers {
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;
  explicit Buffers(const Shape& s) {
    const auto n = static_cast<std::size_t>(s.BH * s.L * s.D);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    for (auto* t : {&q, &k, &v, &dout}) {
      t->resize(n);
      for (auto& x : *t) x = nd(rng);
    }
    out.resize(n);
    dq.resize(n);
    dk.resize(n);
    dv.resize(n);
    lse.resize(static_cast<std::size_t>(s.BH * s.L));
  }
  TensorView view(std::vector<float>& t, const Shape& s) {
    return TensorView::contiguous(t.data(), DType::f32, {1, s.BH, s.L, s.D});
  }
};

void run_attention(benchmark::State& state, Shape s) {
  omp_set_num_threads(s.threads);
  Buffers buf(s);
  memeff::AttentionArgs a;
  a.q = buf.view(buf.q, s);
  a.k = buf.view(buf.k, s);
  a.v = buf.view(buf.v, s);
  a.causal = s.causal ? CausalMode::bottom_right : CausalMode::none;
  a.dropout_p = s.p;
  a.rng = {7, 0};
  memeff::Options o;
  o.backends = {s.backend};
  const TensorView out = buf.view(buf.out, s);
  const TensorView lse = TensorView::contiguous(buf.lse.data(), DType::f32, {1, s.BH, s.L});
  std::vector<std::uint8_t> ws(
      memeff::workspace_size(a, s.backward ? memeff::Pass::backward : memeff::Pass::forward, o));
  o.workspace = ws.data();
  o.workspace_bytes = ws.size();
  memeff::forward(a, out, lse, o);
  const memeff::BackwardTensors g{
      buf.view(buf.dout, s), out,         lse, buf.view(buf.dq, s), buf.view(buf.dk, s),
      buf.view(buf.dv, s),   std::nullopt};
  for (auto _ : state) {
    if (s.backward) {
      memeff::backward(a, g, o);
    } else {
      memeff::forward(a, out, lse, o);
    }
    benchmark::ClobberMemory();
  }
  const double flops =
      memeff::attention_flops(1, s.BH, s.L, s.L, s.D, a.causal) * memeff::pass_flop_factor(s.backward ? memeff::Pass::backward : memeff::Pass::forward);
  state.counters["FLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

#if defined(MEMEFF_HAVE_OPENBLAS)
// C[L×L] = A[L×K]·B[K×L] with K = 2·D·BH: 2·L·L·K = the non-causal attention forward FLOPs.
void run_sgemm(benchmark::State& state, std::int64_t BH, std::int64_t L, std::int64_t D,
               int threads) {
  openblas_set_num_threads(threads);
  const std::int64_t K = 2 * D * BH;
  std::vector<float> a(static_cast<std::size_t>(L * K), 0.5f),
      b(static_cast<std::size_t>(K * L), 0.25f), c(static_cast<std::size_t>(L * L));
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(L), static_cast<int>(L),
                static_cast<int>(K), 1.0f, a.data(), static_cast<int>(K), b.data(),
                static_cast<int>(L), 0.0f, c.data(), static_cast<int>(L));
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * L * L * K, benchmark::Counter::kIsIterationInvariantRate);
}
#endif

std::string name_of(const Shape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s/%s/BH:%lld/L:%lld/D:%lld/causal:%d/p:%.1f/threads:%d",
                s.backend.c_str(), s.backward ? "bwd" : "fwd", static_cast<long long>(s.BH),
                static_cast<long long>(s.L), static_cast<long long>(s.D), s.causal ? 1 : 0, s.p,
                s.threads);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  // (B·H, L): about the same work per pass at each length.
  const std::pair<std::int64_t, std::int64_t> sizes[] = {{8, 512}, {1, 2048}, {1, 8192}};
  const int max_threads = omp_get_max_threads();
  for (auto [BH, L] : sizes) {
    for (std::int64_t D : {64, 128}) {
#if defined(MEMEFF_HAVE_OPENBLAS)
      for (int t = 1; t <= max_threads; t *= 2) {
        char n[96];
        std::snprintf(n, sizeof n, "sgemm/BH:%lld/L:%lld/D:%lld/threads:%d",
                      static_cast<long long>(BH), static_cast<long long>(L),
                      static_cast<long long>(D), t);
        benchmark::RegisterBenchmark(n, run_sgemm, BH, L, D, t)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
#endif
      for (bool backward : {false, true}) {
        for (bool causal : {false, true}) {
          for (double p : {0.0, 0.1}) {
            for (int t = 1; t <= max_threads; t *= 2) {
              const Shape s{BH, L, D, causal, p, t, backward, "cpu"};
              benchmark::RegisterBenchmark(name_of(s).c_str(), run_attention, s)
                  ->Unit(benchmark::kMillisecond)
                  ->UseRealTime();
            }
          }
        }
        if (L <= 2048) {  // the reference is O(L²·D) in double: too slow beyond
          const Shape r{BH, L, D, false, 0.0, 1, backward, "reference"};
          benchmark::RegisterBenchmark(name_of(r).c_str(), run_attention, r)
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime()
              ->Iterations(1);
        }
      }
    }
  }
#if !defined(MEMEFF_HAVE_OPENBLAS)
  std::fprintf(stderr, "memeff_cpu_bench: built without OpenBLAS, no sgemm ceiling rows\n");
#endif
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
