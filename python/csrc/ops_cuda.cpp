// The CUDA kernels of torch.ops.memeff (device_kernels.h over CudaDevice): forward/backward on
// torch's current stream of the inputs' device. A forward with dropout draws its (seed, offset)
// from torch's CUDA generator the graph-safe way PyTorch's own fused attention does
// (philox_cuda_state under the generator's mutex): outside capture the values go straight to the
// kernels and come back as a CPU tensor, with no launch of their own; under capture they live in
// device memory and rng_state.cu resolves them when the graph runs.
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
#include "device_kernels.h"
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

// DeviceKernels' CUDA side: the call on q's device and torch's current stream there. A host
// call that another argument on a GPU brought here (the dispatcher picks CUDA when any tensor is
// on one) names that argument, before anything touches the device.
struct CudaDevice {
  using Guard = c10::cuda::CUDAGuard;

  static void* stream(const at::Tensor& q) { return current_stream(q); }

  static at::Tensor draw_state(const at::Tensor& q, const std::optional<at::Generator>& generator) {
    return draw_cuda_state(q, generator);
  }

  static void check_packed_devices(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                   const std::optional<at::Tensor>& rng_state) {
    if (q.is_cuda()) return;
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
};

using CudaKernels = DeviceKernels<CudaDevice>;

}  // namespace
}  // namespace memeff_torch

TORCH_LIBRARY_IMPL(memeff, CUDA, m) {
  m.impl("fwd", &memeff_torch::CudaKernels::fwd);
  m.impl("bwd", &memeff_torch::CudaKernels::bwd);
  m.impl("varlen_fwd", &memeff_torch::CudaKernels::varlen_fwd);
  m.impl("varlen_bwd", &memeff_torch::CudaKernels::varlen_bwd);
  m.impl("draw_rng_state", &memeff_torch::CudaKernels::draw_rng_state);
}
