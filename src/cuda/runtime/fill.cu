// The fill kernel (fill.h): one grid-stride loop over the view's elements.
#include "cuda/runtime/check.h"
#include "cuda/runtime/fill.h"
#include "cuda/runtime/strided_view.cuh"

namespace memeff::cuda {
namespace {

__global__ void fill_kernel(StridedView t, double value, std::int64_t total) {
  for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < total;
       k += std::int64_t{gridDim.x} * blockDim.x) {
    store(t, offset_of(t, k / t.n[3], k % t.n[3]), value);
  }
}

}  // namespace

void fill(const TensorView& t, double value, cudaStream_t stream) {
  if (!t.defined()) return;
  const StridedView v = strided_view(t);
  const std::int64_t total = v.elements();
  if (total == 0) return;
  fill_kernel<<<elementwise_blocks(total), kElementwiseThreads, 0, stream>>>(v, value, total);
  check_launch("fill_kernel launch");
}

}  // namespace memeff::cuda
