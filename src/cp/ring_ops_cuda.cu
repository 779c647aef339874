// The ring's elementwise work on a GPU (see ring_ops.h): fill, converting copy, accumulate and
// the lse merge as grid-stride kernels over strided [B, H, L, W] views, on the caller's stream.
// They move O(L·D) bytes per rank and step against the attention's O(L²·D) work, so they are
// written for clarity (one element or one row per thread, arithmetic in double), not speed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cp/ring_ops.h"
#include "memeff/error.h"

namespace memeff::cp::detail::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 4096;

// A view as the kernels see it: four dimensions (rank-3 views get a last one of size 1).
struct View4 {
  char* data = nullptr;
  int dtype = 0;  // memeff::DType
  std::int64_t n[4] = {1, 1, 1, 1};
  std::int64_t s[4] = {0, 0, 0, 0};
};

View4 view4(const TensorView& t) {
  View4 v;
  v.data = static_cast<char*>(t.data);
  v.dtype = static_cast<int>(t.dtype);
  for (int d = 0; d < t.rank; ++d) {
    v.n[d] = t.shape[d];
    v.s[d] = t.stride[d];
  }
  return v;
}

__device__ std::int64_t offset_of(const View4& v, std::int64_t row, std::int64_t e) {
  const std::int64_t i = row % v.n[2], h = (row / v.n[2]) % v.n[1], b = row / (v.n[2] * v.n[1]);
  return b * v.s[0] + h * v.s[1] + i * v.s[2] + e * v.s[3];
}

__device__ double load(const View4& v, std::int64_t off) {
  switch (static_cast<DType>(v.dtype)) {
    case DType::f32:
      return reinterpret_cast<const float*>(v.data)[off];
    case DType::f64:
      return reinterpret_cast<const double*>(v.data)[off];
    case DType::f16:
      return __half2float(reinterpret_cast<const __half*>(v.data)[off]);
    case DType::bf16:
      return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(v.data)[off]);
    case DType::i32:
      return reinterpret_cast<const std::int32_t*>(v.data)[off];
  }
  return 0.0;
}

// Rounds through fp32 first for the 16-bit types, as the host's store_from_double does.
__device__ void store(const View4& v, std::int64_t off, double x) {
  switch (static_cast<DType>(v.dtype)) {
    case DType::f32:
      reinterpret_cast<float*>(v.data)[off] = static_cast<float>(x);
      break;
    case DType::f64:
      reinterpret_cast<double*>(v.data)[off] = x;
      break;
    case DType::f16:
      reinterpret_cast<__half*>(v.data)[off] = __float2half_rn(static_cast<float>(x));
      break;
    case DType::bf16:
      reinterpret_cast<__nv_bfloat16*>(v.data)[off] = __float2bfloat16_rn(static_cast<float>(x));
      break;
    case DType::i32:
      reinterpret_cast<std::int32_t*>(v.data)[off] = static_cast<int>(x);
      break;
  }
}

__global__ void fill_kernel(View4 t, double value, std::int64_t total) {
  for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < total;
       k += std::int64_t{gridDim.x} * blockDim.x) {
    store(t, offset_of(t, k / t.n[3], k % t.n[3]), value);
  }
}

__global__ void copy_kernel(View4 dst, View4 src, std::int64_t total) {
  for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < total;
       k += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t row = k / dst.n[3], e = k % dst.n[3];
    store(dst, offset_of(dst, row, e), load(src, offset_of(src, row, e)));
  }
}

__global__ void add_kernel(View4 acc, View4 src, std::int64_t total) {
  for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < total;
       k += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t row = k / acc.n[3], e = k % acc.n[3];
    const std::int64_t o = offset_of(acc, row, e);
    store(acc, o, load(acc, o) + load(src, offset_of(src, row, e)));
  }
}

// One thread per row: the same arithmetic as the host's merge (ring_ops.cpp).
__global__ void merge_kernel(View4 out_acc, View4 lse_acc, View4 out_part, View4 lse_part,
                             std::int64_t rows) {
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
    const double hi = fmax(acc, part), lo = fmin(acc, part);
    const double lse = hi + log1p(exp(lo - hi));
    const double w_acc = exp(acc - lse), w_part = exp(part - lse);
    for (std::int64_t e = 0; e < width; ++e) {
      const std::int64_t o = offset_of(out_acc, r, e);
      store(out_acc, o,
            w_acc * load(out_acc, o) + w_part * load(out_part, offset_of(out_part, r, e)));
    }
    store(lse_acc, lse_off, lse);
  }
}

int blocks_for(std::int64_t work) {
  return static_cast<int>(
      std::clamp<std::int64_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

std::int64_t elements(const View4& v) { return v.n[0] * v.n[1] * v.n[2] * v.n[3]; }

// Launches on the device of the view, restoring the caller's device afterwards.
class Launch {
 public:
  explicit Launch(const TensorView& t) {
    cudaGetDevice(&previous_);
    if (previous_ != t.device.index) cudaSetDevice(t.device.index);
  }
  ~Launch() { cudaSetDevice(previous_); }
  static void check(const char* kernel) {
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) {
      throw Error(ErrorCode::cuda_error, std::string("context parallel: launch of ") + kernel +
                                             " failed: " + cudaGetErrorName(status) + ": " +
                                             cudaGetErrorString(status));
    }
  }

 private:
  int previous_ = 0;
};

}  // namespace

void fill(const TensorView& t, double value, void* stream) {
  const View4 v = view4(t);
  const std::int64_t total = elements(v);
  if (total == 0) return;
  Launch launch(t);
  fill_kernel<<<blocks_for(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(v, value,
                                                                                     total);
  Launch::check("fill_kernel");
}

void copy(const TensorView& dst, const TensorView& src, void* stream) {
  const View4 d = view4(dst), s = view4(src);
  const std::int64_t total = elements(d);
  if (total == 0) return;
  Launch launch(dst);
  copy_kernel<<<blocks_for(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(d, s, total);
  Launch::check("copy_kernel");
}

void add(const TensorView& acc, const TensorView& src, void* stream) {
  const View4 a = view4(acc), s = view4(src);
  const std::int64_t total = elements(a);
  if (total == 0) return;
  Launch launch(acc);
  add_kernel<<<blocks_for(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, s, total);
  Launch::check("add_kernel");
}

void merge(const TensorView& out_acc, const TensorView& lse_acc, const TensorView& out_part,
           const TensorView& lse_part, void* stream) {
  const View4 oa = view4(out_acc), la = view4(lse_acc), op = view4(out_part), lp = view4(lse_part);
  const std::int64_t rows = oa.n[0] * oa.n[1] * oa.n[2];
  if (rows == 0) return;
  Launch launch(out_acc);
  merge_kernel<<<blocks_for(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(oa, la, op, lp,
                                                                                     rows);
  Launch::check("merge_kernel");
}

}  // namespace memeff::cp::detail::cuda
