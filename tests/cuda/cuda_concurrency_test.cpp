// Several host threads, each with a CUDA stream of its own (Options::stream), calling forward and
// backward through the dispatcher on one fused backend at once (cuda; cuda_sm90 on compute
// capability 9.0), as PyTorch's autograd threads and a user's threads do: mixed shapes, fp16 and
// bf16, causal modes, dropout, GQA, biases, BLHD strides. Each result must equal the same call
// made on one thread first: bit for bit for the forward and the deterministic backward, within
// test::fused_kernel_tolerance for the default backward (dq and broadcast dbias accumulate across
// CTAs in a run-dependent order). Memory is allocated, filled and freed in stream order, so the
// threads' work overlaps on the device; and one CudaGenerator drawn from on all the threads'
// streams at once. The CPU side of the same stress is tests/unit/concurrency_test.cpp.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/bitwise.h"
#include "common/host_tensor.h"
#include "common/kernel_case.h"
#include "common/tolerance.h"
#include "cuda/device_tensor.h"
#include "memeff/attention.h"
#include "memeff/cuda_generator.h"

namespace memeff {
namespace {

using test::HostTensor;
using test::KernelCase;

constexpr int kThreads = 4;  // host threads, one stream each
constexpr int kRounds = 3;   // each thread runs every case this many times

// A non-blocking stream for the life of the object.
class Stream {
 public:
  Stream() {
    test::cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                     "cudaStreamCreateWithFlags");
  }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// A host tensor's storage on device 0, allocated, filled and freed in the order of `stream`:
// a copy of the host's bytes, or all-ones bytes (NaN in fp32, fp16 and bf16, so an element the
// call never writes fails the comparison).
class StreamTensor {
 public:
  StreamTensor(const HostTensor& host, cudaStream_t stream, bool copy)
      : stream_(stream), bytes_(host.storage.size()), view_(host.view) {
    test::cuda_check(cudaMallocAsync(&data_, bytes_, stream), "cudaMallocAsync");
    if (copy) {
      test::cuda_check(
          cudaMemcpyAsync(data_, host.storage.data(), bytes_, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync H2D");
    } else {
      test::cuda_check(cudaMemsetAsync(data_, 0xFF, bytes_, stream), "cudaMemsetAsync");
    }
    view_.data = data_;
    view_.device = Device::cuda(0);
  }
  ~StreamTensor() { cudaFreeAsync(data_, stream_); }
  StreamTensor(const StreamTensor&) = delete;
  StreamTensor& operator=(const StreamTensor&) = delete;

  const TensorView& view() const { return view_; }
  // Enqueues the copy of the device bytes into `host` (same shape, dtype and strides).
  void copy_to(HostTensor& host) const {
    test::cuda_check(
        cudaMemcpyAsync(host.storage.data(), data_, bytes_, cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync D2H");
  }

 private:
  cudaStream_t stream_;
  std::size_t bytes_;
  void* data_ = nullptr;
  TensorView view_;
};

struct Results {
  HostTensor out, lse, dq, dk, dv;
  std::optional<HostTensor> dbias;
};

// The case's forward, then its backward from that forward's out and lse, on `stream`; the
// results copied back once the stream is done.
Results run_on_stream(const KernelCase& c, const test::KernelInputs& in, cudaStream_t stream) {
  Results r{HostTensor(c.dtype, {c.B, c.Hq, c.Lq, c.dv()}, c.layout),
            HostTensor(DType::f32, {c.B, c.Hq, c.Lq}),
            HostTensor(c.dtype, {c.B, c.Hq, c.Lq, c.D}, c.layout),
            HostTensor(c.dtype, {c.B, c.Hkv, c.Lk, c.D}, c.layout),
            HostTensor(c.dtype, {c.B, c.Hkv, c.Lk, c.dv()}, c.layout),
            std::nullopt};
  if (in.bias) r.dbias.emplace(c.bias_dtype, c.bias_shape());
  const StreamTensor q(in.q, stream, true), k(in.k, stream, true), v(in.v, stream, true),
      dout(*in.dout, stream, true), out(r.out, stream, false), lse(r.lse, stream, false),
      dq(r.dq, stream, false), dk(r.dk, stream, false), dv(r.dv, stream, false);
  std::optional<StreamTensor> bias, dbias;
  if (in.bias) {
    bias.emplace(*in.bias, stream, true);
    dbias.emplace(*r.dbias, stream, false);
  }
  const AttentionArgs args =
      c.args(q.view(), k.view(), v.view(), bias ? std::optional(bias->view()) : std::nullopt);
  Options options = test::only({c.backend});
  options.stream = stream;
  options.deterministic = c.deterministic;
  EXPECT_EQ(forward(args, out.view(), lse.view(), options).backend, c.backend);
  BackwardTensors grads{dout.view(), out.view(), lse.view(),  dq.view(),
                        dk.view(),   dv.view(),  std::nullopt};
  if (dbias) grads.dbias = dbias->view();
  EXPECT_EQ(backward(args, grads, options).backend, c.backend);
  out.copy_to(r.out);
  lse.copy_to(r.lse);
  dq.copy_to(r.dq);
  dk.copy_to(r.dk);
  dv.copy_to(r.dv);
  if (dbias) dbias->copy_to(*r.dbias);
  test::cuda_check(cudaStreamSynchronize(stream), "the case's kernels and copies");
  return r;
}

void expect_same_results(const KernelCase& c, const Results& got, const Results& want,
                         const std::string& where) {
  const std::string what = where + " " + c.describe() + ":";
  test::expect_bitwise_equal(got.out, want.out, what + " out");
  test::expect_bitwise_equal(got.lse, want.lse, what + " lse");
  auto gradient = [&](const HostTensor& g, const HostTensor& w, const std::string& name) {
    if (c.deterministic) {
      test::expect_bitwise_equal(g, w, what + " " + name);
    } else {
      test::expect_close(g, w, test::fused_kernel_tolerance(c.dtype), what + " " + name);
    }
  };
  gradient(got.dq, want.dq, "dq");
  gradient(got.dk, want.dk, "dk");
  gradient(got.dv, want.dv, "dv");
  if (want.dbias) gradient(*got.dbias, *want.dbias, "dbias");
}

std::vector<KernelCase> stress_cases(const std::string& backend) {
  constexpr DType f16 = DType::f16;
  constexpr CausalMode top_left = CausalMode::top_left, bottom_right = CausalMode::bottom_right;
  // One row per case, as a table (KernelCase's defaults: bf16, BHLD, no mask, bias or dropout).
  // clang-format off
  std::vector<KernelCase> cases = {
      {.B = 2, .Hq = 4, .Hkv = 4, .Lq = 128, .Lk = 128, .D = 64},
      {.Lq = 200, .Lk = 333, .D = 128, .causal = top_left, .dropout = 0.1, .dtype = f16},
      {.B = 2, .Hq = 8, .Hkv = 2, .Lq = 96, .Lk = 256, .D = 64, .causal = bottom_right,
       .bias = "1h1k", .dropout = 0.2, .deterministic = true},
      {.Lq = 65, .Lk = 64, .D = 40, .bias = "11qk", .dtype = f16, .layout = test::Layout::blhd},
      {.Hq = 6, .Hkv = 3, .Lq = 300, .Lk = 256, .D = 128, .dropout = 0.15,
       .layout = test::Layout::blhd, .deterministic = true},
      // Bottom-right with Lq > Lk: rows that see no key.
      {.Lq = 333, .Lk = 200, .D = 64, .causal = bottom_right, .dropout = 0.1, .dtype = f16},
      {.B = 3, .Hq = 2, .Hkv = 1, .Lq = 17, .Lk = 1013, .D = 64, .bias = "bh1k", .dtype = f16,
       .deterministic = true},
  };
  // clang-format on
  for (KernelCase& c : cases) c.backend = backend;
  return cases;
}

class CudaConcurrency : public test::PerBackend {};

TEST_P(CudaConcurrency, ThreadsWithStreamsOfTheirOwnGetTheSingleThreadedResults) {
  const std::vector<KernelCase> cases = stress_cases(GetParam());
  std::vector<test::KernelInputs> inputs;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    inputs.emplace_back(cases[i], 900 + i, /*with_dout=*/true);
  }

  // One thread first: the results every thread must reproduce (no NaN: every element written).
  std::vector<Results> expected;
  {
    const Stream stream;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      expected.push_back(run_on_stream(cases[i], inputs[i], stream.get()));
      const Results& e = expected.back();
      for (const HostTensor* t : {&e.out, &e.lse, &e.dq, &e.dk, &e.dv}) {
        test::expect_bitwise_equal(*t, *t, "single thread " + cases[i].describe());
      }
    }
  }
  ASSERT_FALSE(::testing::Test::HasFailure()) << "the single-threaded calls failed already";

  std::atomic<int> calls{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        const Stream stream;
        for (int round = 0; round < kRounds; ++round) {
          for (std::size_t n = 0; n < cases.size(); ++n) {
            // Each thread and round starts elsewhere in the list, so different cases overlap.
            const std::size_t i = (n + static_cast<std::size_t>(t * 3 + round)) % cases.size();
            const Results got = run_on_stream(cases[i], inputs[i], stream.get());
            calls += 2;
            expect_same_results(cases[i], got, expected[i],
                                "thread " + std::to_string(t) + " round " + std::to_string(round));
          }
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << t << " threw: " << e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(calls.load(), kThreads * kRounds * static_cast<int>(cases.size()) * 2);
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaConcurrency, ::testing::Values("cuda", "cuda_sm90"),
                         test::backend_name);

// One generator shared by threads that draw on streams of their own: every draw takes an offset
// of its own (the counter advances atomically on the device), so no two calls share a mask.
TEST(CudaConcurrencyGenerator, DrawsOnManyStreamsNeverShareAnOffset) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  constexpr int kDraws = 200;  // per thread
  constexpr std::uint64_t kSeed = 77, kStart = 1000;
  CudaGenerator generator(kSeed, 0, kStart);
  std::vector<std::vector<std::uint64_t>> drawn(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        const Stream stream;
        HostTensor states(DType::f64, {kDraws, 2});  // host room for the drawn words
        const StreamTensor device(states, stream.get(), false);
        auto* words = static_cast<std::uint64_t*>(device.view().data);
        for (int d = 0; d < kDraws; ++d) {
          const RngState rng = generator.draw(stream.get(), words + 2 * d);
          EXPECT_EQ(rng.device_offset, words + 2 * d + 1);
        }
        device.copy_to(states);
        test::cuda_check(cudaStreamSynchronize(stream.get()), "the draws");
        for (int d = 0; d < kDraws; ++d) {
          std::uint64_t word[2];
          std::memcpy(word, states.storage.data() + 16 * d, sizeof word);
          EXPECT_EQ(word[0], kSeed);
          drawn[t].push_back(word[1]);
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << t << " threw: " << e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::uint64_t> all;
  for (const auto& d : drawn) {
    EXPECT_TRUE(std::is_sorted(d.begin(), d.end())) << "one stream's draws are in order";
    all.insert(all.end(), d.begin(), d.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<std::uint64_t> want(kThreads * kDraws);
  std::iota(want.begin(), want.end(), kStart);
  EXPECT_EQ(all, want) << "some offsets were drawn twice or skipped";
  EXPECT_EQ(generator.offset(), kStart + kThreads * kDraws);
}

}  // namespace
}  // namespace memeff
