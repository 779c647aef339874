// The ring's own elementwise work and memory, on the device of its tensors: host loops for CPU
// views, CUDA kernels on the caller's stream for GPU views (ring_ops_cuda.cu, built with CUDA).
// Views are rank 3 or 4 with a contiguous last dimension; accumulators are fp32 views (fp64 when
// the attention's tensors are fp64, so the reference keeps its precision through the merge).
#pragma once

#include <cstddef>

#include "memeff/tensor.h"

namespace memeff::cp::detail {

// The alignment of a DeviceBuffer's memory (cudaMallocAsync's is at least this); the ring carves
// its scratch into pieces that start on it.
inline constexpr std::size_t kBufferAlign = 256;

// Scratch on a device: aligned host memory, or cudaMallocAsync/cudaFreeAsync on `stream`.
class DeviceBuffer {
 public:
  DeviceBuffer(Device device, std::size_t bytes, void* stream);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }

 private:
  Device device_;
  void* data_ = nullptr;
  [[maybe_unused]] void* stream_ = nullptr;  // where a CUDA buffer is freed (unused on the host)
};

// t[...] = value for every element.
void fill(const TensorView& t, double value, void* stream);
// dst = src element by element (same shape), converted to dst's dtype (round to nearest even).
void copy(const TensorView& dst, const TensorView& src, void* stream);
// acc += src element by element (same shape); acc is an accumulator view.
void add(const TensorView& acc, const TensorView& src, void* stream);
// Merges one partial result (out_part [B, H, L, Dv] normalized over its keys, lse_part [B, H, L])
// into the running (out_acc, lse_acc), row by row:
//   lse = max + log1p(exp(min - max)) of (lse_acc, lse_part);
//   out_acc = exp(lse_acc - lse)·out_acc + exp(lse_part - lse)·out_part.
// A part with lse -inf (no visible key in its block) changes nothing, and an accumulator still at
// -inf takes the part as it is (a copy: one block gives the block's bits), so rows that see no key
// anywhere end with out = 0, lse = -inf and no NaN.
void merge(const TensorView& out_acc, const TensorView& lse_acc, const TensorView& out_part,
           const TensorView& lse_part, void* stream);

#if defined(MEMEFF_WITH_CUDA)
// The CUDA versions (ring_ops_cuda.cu); the functions above call them for CUDA views.
namespace cuda {
void fill(const TensorView& t, double value, void* stream);
void copy(const TensorView& dst, const TensorView& src, void* stream);
void add(const TensorView& acc, const TensorView& src, void* stream);
void merge(const TensorView& out_acc, const TensorView& lse_acc, const TensorView& out_part,
           const TensorView& lse_part, void* stream);
}  // namespace cuda
#endif

}  // namespace memeff::cp::detail
