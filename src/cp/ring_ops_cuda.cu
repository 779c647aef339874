// The ring's elementwise work on a GPU (see ring_ops.h): fill, converting copy, accumulate and
// the lse merge as grid-stride kernels over strided [B, H, L, W] views, on the caller's stream.
// They move O(L·D) bytes per rank and step against the attention's O(L²·D) work, so they are
// written for clarity (one element or one row per thread, arithmetic in double), not speed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cp/ring_ops.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/device.h"
#include "cuda/runtime/fill.h"
#include "cuda/runtime/strided_view.cuh"
#include "memeff/error.h"

namespace memeff::cp::detail::cuda {

namespace runtime = memeff::cuda;
using runtime::StridedView;

namespace {

__global__ void copy_kernel(StridedView dst, StridedView src, std::int64_t total) {
  for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < total;
       k += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t row = k / dst.n[3], e = k % dst.n[3];
    store(dst, offset_of(dst, row, e), load(src, offset_of(src, row, e)));
  }
}

__global__ void add_kernel(StridedView acc, StridedView src, std::int64_t total) {
  for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < total;
       k += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t row = k / acc.n[3], e = k % acc.n[3];
    const std::int64_t o = offset_of(acc, row, e);
    store(acc, o, load(acc, o) + load(src, offset_of(src, row, e)));
  }
}

// One thread per row: the same arithmetic as the host's merge (ring_ops.cpp).
__global__ void merge_kernel(StridedView out_acc, StridedView lse_acc, StridedView out_part,
                             StridedView lse_part, std::int64_t rows) {
  for (std::int64_t r = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += std::int64_t{gridDim.x} * blockDim.x) {
    const double part = load(lse_part, offset_of(lse_part, r, 0));
    if (isinf(part) && part < 0) continue;
    const std::int64_t lse_off = offset_of(lse_acc, r, 0);
    const double acc = load(lse_acc, lse_off);
    const std::int64_t width = out_acc.n[3];
    if (isinf(acc) && acc < 0) {
      for (std::int64_t e = 0; e < width; ++e) {
        store(out_acc, offset_of(out_acc, r, e), load(out_part, offset_of(out_part, r, e)));
      }
      store(lse_acc, lse_off, part);
      continue;
    }
    // A NaN lse makes the merged row NaN (fmax and fmin would drop it; docs/api.md).
    const double hi = fmax(acc, part), lo = fmin(acc, part);
    const double lse = isnan(acc) || isnan(part) ? NAN : hi + log1p(exp(lo - hi));
    const double w_acc = exp(acc - lse), w_part = exp(part - lse);
    for (std::int64_t e = 0; e < width; ++e) {
      const std::int64_t o = offset_of(out_acc, r, e);
      store(out_acc, o,
            w_acc * load(out_acc, o) + w_part * load(out_part, offset_of(out_part, r, e)));
    }
    store(lse_acc, lse_off, lse);
  }
}

}  // namespace

void fill(const TensorView& t, double value, void* stream) {
  runtime::DeviceScope device(t.device.index);
  runtime::fill(t, value, static_cast<cudaStream_t>(stream));
}

void copy(const TensorView& dst, const TensorView& src, void* stream) {
  const StridedView d = runtime::strided_view(dst), s = runtime::strided_view(src);
  const std::int64_t total = d.elements();
  if (total == 0) return;
  runtime::DeviceScope device(dst.device.index);
  copy_kernel<<<runtime::elementwise_blocks(total), runtime::kElementwiseThreads, 0,
                static_cast<cudaStream_t>(stream)>>>(d, s, total);
  runtime::check_launch("context parallel: copy_kernel launch");
}

void add(const TensorView& acc, const TensorView& src, void* stream) {
  const StridedView a = runtime::strided_view(acc), s = runtime::strided_view(src);
  const std::int64_t total = a.elements();
  if (total == 0) return;
  runtime::DeviceScope device(acc.device.index);
  add_kernel<<<runtime::elementwise_blocks(total), runtime::kElementwiseThreads, 0,
               static_cast<cudaStream_t>(stream)>>>(a, s, total);
  runtime::check_launch("context parallel: add_kernel launch");
}

void merge(const TensorView& out_acc, const TensorView& lse_acc, const TensorView& out_part,
           const TensorView& lse_part, void* stream) {
  const StridedView oa = runtime::strided_view(out_acc), la = runtime::strided_view(lse_acc),
                    op = runtime::strided_view(out_part), lp = runtime::strided_view(lse_part);
  const std::int64_t rows = oa.rows();
  if (rows == 0) return;
  runtime::DeviceScope device(out_acc.device.index);
  merge_kernel<<<runtime::elementwise_blocks(rows), runtime::kElementwiseThreads, 0,
                 static_cast<cudaStream_t>(stream)>>>(oa, la, op, lp, rows);
  runtime::check_launch("context parallel: merge_kernel launch");
}

}  // namespace memeff::cp::detail::cuda
