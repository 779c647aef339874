// The CUDA kernels of torch.ops.memeff: forward/backward on torch's current stream of the
// inputs' device. A forward with dropout draws its (seed, offset) from torch's CUDA generator
// the graph-safe way PyTorch's own fused attention does (philox_cuda_state under the generator's
// mutex): outside capture the values go straight to the kernels and come back as a CPU tensor,
// with no launch of their own; under capture they live in device memory and rng_state.cu
// resolves them when the graph runs.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "bindings.h"
#include "rng_state.h"

namespace memeff_torch {
namespace {

// Philox offset units a memeff call takes from torch's generator. memeff's offset selects an
// independent mask stream, so any step >= 1 works; torch rounds increments to multiples of 4.
constexpr std::uint64_t kOffsetIncrement = 4;

void* current_stream(const at::Tensor& t) {
  return static_cast<void*>(c10::cuda::getCurrentCUDAStream(t.get_device()).stream());
}

at::Tensor draw_cuda_state(const at::Tensor& q, const std::optional<at::Generator>& generator) {
  auto* gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
      generator, at::cuda::detail::getDefaultCUDAGenerator(q.get_device()));
  at::PhiloxCudaState philox;
  {
    std::lock_guard<std::mutex> lock(gen->mutex_);
    philox = gen->philox_cuda_state(kOffsetIncrement);
  }
  if (!philox.captured_) return cpu_state(philox.seed_.val, philox.offset_.val);
  at::Tensor state = at::empty({2}, q.options().dtype(at::kLong));
  const cudaError_t err = launch_write_captured_rng_state(
      philox.seed_.ptr, philox.offset_.ptr, static_cast<std::uint64_t>(philox.offset_intragraph_),
      reinterpret_cast<std::uint64_t*>(state.data_ptr<std::int64_t>()),
      c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, "memeff: launching the rng_state kernel failed: ",
              cudaGetErrorString(err));
  return state;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& rng_state,
    double dropout_p, c10::string_view causal, std::optional<double> scale,
    std::vector<std::string> backends, std::optional<at::Generator> generator, std::int64_t q_start,
    std::int64_t k_start, bool kv_block) {
  const c10::cuda::CUDAGuard guard(q.device());
  return forward_on(q, k, v, bias, rng_state,
                    needs_draw(rng_state, dropout_p) ? draw_cuda_state(q, generator) : no_state(),
                    dropout_p, causal, scale, std::move(backends), {q_start, k_start, kv_block},
                    current_stream(q));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bwd_cuda(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& rng_state, double dropout_p, c10::string_view causal,
    std::optional<double> scale, bool bias_grad, std::vector<std::string> backends,
    std::int64_t q_start, std::int64_t k_start, bool kv_block) {
  const c10::cuda::CUDAGuard guard(q.device());
  return backward_on(dout, q, k, v, bias, out, lse, rng_state, dropout_p, causal, scale, bias_grad,
                     std::move(backends), {q_start, k_start, kv_block}, current_stream(q));
}

at::Tensor draw_rng_state_cuda(const at::Tensor& like, std::optional<at::Generator> generator) {
  const c10::cuda::CUDAGuard guard(like.device());
  return draw_cuda_state(like, generator);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_fwd_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
    const std::optional<at::Tensor>& rng_state, double dropout_p, c10::string_view causal,
    std::optional<double> scale, std::vector<std::string> backends, bool check_offsets,
    std::optional<at::Generator> generator) {
  if (!q.is_cuda()) {  // another argument on a GPU brought a host call here: name it
    const std::pair<const char*, const at::Tensor*> others[] = {
        {"k", &k}, {"v", &v}, {"cu_seqlens_q", &cu_seqlens_q}, {"cu_seqlens_k", &cu_seqlens_k}};
    for (const auto& [name, t] : others) {
      TORCH_CHECK_VALUE(!t->is_cuda(), "argument `", name, "`: expected it on ", q.device(),
                        " (the device of q), got ", t->device());
    }
    TORCH_CHECK_VALUE(false, "argument `rng_state`: expected it on the CPU or on ", q.device(),
                      " (the device of q), got ",
                      rng_state && rng_state->defined() ? rng_state->device() : q.device());
  }
  const c10::cuda::CUDAGuard guard(q.device());
  return varlen_forward_on(
      q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, rng_state,
      needs_draw(rng_state, dropout_p) ? draw_cuda_state(q, generator) : no_state(), dropout_p,
      causal, scale, std::move(backends), check_offsets, current_stream(q));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_bwd_cuda(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, std::int64_t max_seqlen_q,
    std::int64_t max_seqlen_k, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& rng_state, double dropout_p, c10::string_view causal,
    std::optional<double> scale, std::vector<std::string> backends) {
  const c10::cuda::CUDAGuard guard(q.device());
  return varlen_backward_on(dout, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            out, lse, rng_state, dropout_p, causal, scale, std::move(backends),
                            current_stream(q));
}

}  // namespace
}  // namespace memeff_torch

TORCH_LIBRARY_IMPL(memeff, CUDA, m) {
  m.impl("fwd", &memeff_torch::fwd_cuda);
  m.impl("bwd", &memeff_torch::bwd_cuda);
  m.impl("varlen_fwd", &memeff_torch::varlen_fwd_cuda);
  m.impl("varlen_bwd", &memeff_torch::varlen_bwd_cuda);
  m.impl("draw_rng_state", &memeff_torch::draw_rng_state_cuda);
}
