// Dropout randomness under CUDA graphs: a captured draw + forward + backward replayed N times
// gives N different masks, each replay equal to an eager run at the matching offset (forward
// bitwise, backward to rounding), and seed/offset read from device memory equal the by-value path.
// Each test runs its forward and backward on the mma.sync kernels (cuda) and on the Hopper
// kernels (cuda_sm90).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/host_tensor.h"
#include "cuda/device_tensor.h"
#include "memeff/attention.h"
#include "memeff/cuda_generator.h"

namespace memeff {
namespace {

using test::HostTensor;
using Buffer = test::DeviceTensor;

struct GraphCase {
  static constexpr std::int64_t B = 1, H = 2, Lq = 128, Lk = 192, D = 64;
  HostTensor q{DType::bf16, {B, H, Lq, D}}, k{DType::bf16, {B, H, Lk, D}},
      v{DType::bf16, {B, H, Lk, D}}, dout{DType::bf16, {B, H, Lq, D}};
  HostTensor out{DType::bf16, {B, H, Lq, D}}, lse{DType::f32, {B, H, Lq}};
  HostTensor dq{DType::bf16, {B, H, Lq, D}}, dk{DType::bf16, {B, H, Lk, D}},
      dv{DType::bf16, {B, H, Lk, D}};
  GraphCase() {
    std::mt19937_64 rng(2024);
    test::fill_uniform(q, rng);
    test::fill_uniform(k, rng);
    test::fill_uniform(v, rng);
    test::fill_uniform(dout, rng);
    test::poison(out);
    test::poison(lse);
    test::poison(dq);
    test::poison(dk);
    test::poison(dv);
  }
};

// Max |a - b| relative to max |b| over two tensors of one shape.
double relative_diff(const HostTensor& a, const HostTensor& b) {
  double diff = 0.0, ref = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = b.get(i);
    if (std::isnan(x) || std::isnan(y)) return INFINITY;
    diff = std::max(diff, std::abs(x - y));
    ref = std::max(ref, std::abs(y));
  }
  return diff / std::max(ref, 1e-30);
}

// Each test runs its backend's forward and backward (both fused backends have both passes).
class CudaGraph : public test::PerBackend {
 protected:
  std::vector<std::string> order() const { return {GetParam()}; }
};

TEST_P(CudaGraph, ReplaysDrawFreshMasksEachMatchingAnEagerRun) {
  GraphCase pb;
  Buffer q(pb.q), k(pb.k), v(pb.v), dout(pb.dout), out(pb.out), lse(pb.lse), dq(pb.dq), dk(pb.dk),
      dv(pb.dv);
  std::uint64_t* state = nullptr;
  ASSERT_EQ(cudaMalloc(&state, 2 * sizeof(std::uint64_t)), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

  AttentionArgs args = test::attention_args(q, k, v);
  args.dropout_p = 0.25;
  BackwardTensors grads{dout.view, out.view, lse.view, dq.view, dk.view, dv.view, std::nullopt};
  Options opt;
  opt.backends = order();
  opt.stream = stream;
  // A caller-provided workspace keeps the captured graph free of allocations.
  const std::size_t ws_bytes = workspace_size(args, Pass::backward, opt);
  void* workspace = nullptr;
  if (ws_bytes > 0) {
    ASSERT_EQ(cudaMalloc(&workspace, ws_bytes), cudaSuccess);
  }
  opt.workspace = workspace;
  opt.workspace_bytes = ws_bytes;

  const std::uint64_t seed = 0x5EEDull;
  CudaGenerator gen(seed, 0, /*offset=*/0);
  // Eager warm-up (lazy one-time setup stays out of the capture); it also advances the counter.
  args.rng = gen.draw(stream, state);
  EXPECT_EQ(forward(args, out.view, lse.view, opt).backend, GetParam());
  EXPECT_EQ(backward(args, grads, opt).backend, GetParam());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(gen.offset(), 1u);
  // The same draw, by value, gives bitwise the same forward.
  const std::vector<std::uint8_t> eager_gen_out = out.bytes_on_host();

  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  args.rng = gen.draw(stream, state);
  forward(args, out.view, lse.view, opt);
  backward(args, grads, opt);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  gen.set_offset(0);  // capturing ran nothing; replays start at offset 0

  constexpr int kReplays = 3;
  std::vector<HostTensor> outs, dqs;
  for (int r = 0; r < kReplays; ++r) {
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    outs.push_back(out.to_host(pb.out));
    dqs.push_back(dq.to_host(pb.dq));
  }
  EXPECT_EQ(gen.offset(), static_cast<std::uint64_t>(kReplays));
  EXPECT_EQ(std::memcmp(outs[0].storage.data(), eager_gen_out.data(), eager_gen_out.size()), 0)
      << "replay 0 (offset 0) differs from the eager run that drew offset 0";

  // Different masks per replay: a good share of the output elements differ.
  for (int a = 0; a < kReplays; ++a) {
    for (int b = a + 1; b < kReplays; ++b) {
      std::int64_t differ = 0;
      for (std::int64_t i = 0; i < outs[a].numel(); ++i) differ += outs[a].get(i) != outs[b].get(i);
      EXPECT_GT(differ, outs[a].numel() / 2) << "replays " << a << " and " << b << " look alike";
    }
  }

  // Each replay equals an eager run with the offset by value.
  for (int r = 0; r < kReplays; ++r) {
    AttentionArgs eager = args;
    eager.rng = RngState{};
    eager.rng.seed = seed;
    eager.rng.offset = static_cast<std::uint64_t>(r);
    forward(eager, out.view, lse.view, opt);
    backward(eager, grads, opt);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const HostTensor o = out.to_host(pb.out), g = dq.to_host(pb.dq);
    EXPECT_EQ(std::memcmp(o.storage.data(), outs[r].storage.data(), o.storage.size()), 0)
        << "replay " << r << " out differs from the eager forward at offset " << r;
    EXPECT_LE(relative_diff(dqs[r], g), 1e-2) << "replay " << r << " dq differs from eager";
  }

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFree(state);
  cudaFree(workspace);
}

TEST_P(CudaGraph, SeedAndOffsetFromDeviceMemoryEqualTheValues) {
  GraphCase pb;
  Buffer q(pb.q), k(pb.k), v(pb.v), out(pb.out), lse(pb.lse);
  AttentionArgs args = test::attention_args(q, k, v);
  args.dropout_p = 0.3;
  args.causal = CausalMode::bottom_right;
  Options opt;
  opt.backends = order();
  const std::uint64_t words[2] = {0xABCDEF0123456789ull, 0x100000007ull};
  args.rng.seed = words[0];
  args.rng.offset = words[1];
  forward(args, out.view, lse.view, opt);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<std::uint8_t> by_value = out.bytes_on_host(), lse_by_value = lse.bytes_on_host();

  std::uint64_t* d_words = nullptr;
  ASSERT_EQ(cudaMalloc(&d_words, sizeof(words)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_words, words, sizeof(words), cudaMemcpyHostToDevice), cudaSuccess);
  AttentionArgs from_device = args;
  from_device.rng = RngState{};  // values 0: only the pointers carry the state
  from_device.rng.device_seed = d_words;
  from_device.rng.device_offset = d_words + 1;
  HostTensor poisoned = pb.out;
  test::poison(poisoned);
  ASSERT_EQ(cudaMemcpy(out.data, poisoned.storage.data(), out.bytes, cudaMemcpyHostToDevice), cudaSuccess);
  forward(from_device, out.view, lse.view, opt);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(out.bytes_on_host(), by_value);
  EXPECT_EQ(lse.bytes_on_host(), lse_by_value);

  // And a different device offset changes the mask.
  const std::uint64_t other[2] = {words[0], words[1] + 1};
  ASSERT_EQ(cudaMemcpy(d_words, other, sizeof(other), cudaMemcpyHostToDevice), cudaSuccess);
  forward(from_device, out.view, lse.view, opt);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_NE(out.bytes_on_host(), by_value);
  cudaFree(d_words);
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaGraph, ::testing::Values("cuda", "cuda_sm90"),
                         test::backend_name);

}  // namespace
}  // namespace memeff
