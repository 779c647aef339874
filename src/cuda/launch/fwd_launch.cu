// Forward launcher: picks the head-dim bucket and dtype instantiation for validated params, and
// lists the reasons the fused forward cannot run a problem (the dispatcher prints them). Also the
// strided fill kernel the cuda backend uses for the empty-length edge cases.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/varlen.cuh"
#include "cuda/launch/launch.h"
#include "cuda/launch/launch_checks.h"
#include "cuda/sm80/fwd_dispatch.cuh"
#include "memeff/error.h"

namespace memeff::cuda {

namespace {
// An empty kernel compiled with the same targets as every other kernel of the library.
__global__ void kernel_image_probe() {}
}  // namespace

cudaError_t probe_kernel_image() {
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, kernel_image_probe);
  if (err != cudaSuccess) cudaGetLastError();  // not sticky; keep it from later calls
  return err;
}
namespace {

template <class T>
__global__ void fill_kernel(T* data, std::int64_t n1, std::int64_t n2, std::int64_t n3,
                            std::int64_t s0, std::int64_t s1, std::int64_t s2, std::int64_t total,
                            T value) {
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       idx < total; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i3 = idx % n3, i2 = (idx / n3) % n2, i1 = (idx / (n3 * n2)) % n1,
                       i0 = idx / (n3 * n2 * n1);
    data[i0 * s0 + i1 * s1 + i2 * s2 + i3] = value;
  }
}

template <class T>
void launch_fill(void* data, const std::int64_t (&shape)[4], const std::int64_t (&stride)[4],
                 T value, cudaStream_t stream) {
  const std::int64_t total = shape[0] * shape[1] * shape[2] * shape[3];
  if (total == 0) return;
  const std::int64_t blocks = std::min<std::int64_t>((total + 255) / 256, 65535);
  fill_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      static_cast<T*>(data), shape[1], shape[2], shape[3], stride[0], stride[1], stride[2], total,
      value);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw Error(ErrorCode::cuda_error, std::string("fill_kernel launch: ") + cudaGetErrorString(err));
  }
}

}  // namespace

void fill_strided(void* data, FillKind kind, const std::int64_t (&shape)[4],
                  const std::int64_t (&stride)[4], float value, cudaStream_t stream) {
  switch (kind) {
    case FillKind::f32: launch_fill<float>(data, shape, stride, value, stream); break;
    case FillKind::f16: launch_fill<__half>(data, shape, stride, __float2half_rn(value), stream); break;
    case FillKind::bf16:
      launch_fill<__nv_bfloat16>(data, shape, stride, __float2bfloat16_rn(value), stream);
      break;
  }
}

std::vector<std::string> forward_unsupported(const ForwardParams& p, int sm_major, int sm_minor) {
  std::vector<std::string> reasons;
  if (sm_major < 8) {
    reasons.push_back("needs compute capability 8.0 or newer (mma.sync bf16, cp.async); device has " +
                      std::to_string(sm_major) + "." + std::to_string(sm_minor));
  }
  if (p.D <= 0 || p.D % 8 != 0 || head_dim_bucket(kForwardHeadDims, p.D) == 0) {
    reasons.push_back("head dim D = " + std::to_string(p.D) + " is not a multiple of 8 in [8, 256]");
  }
  if (p.Dv <= 0 || p.Dv % 8 != 0 || head_dim_bucket(kForwardHeadDims, p.Dv) == 0) {
    reasons.push_back("value head dim Dv = " + std::to_string(p.Dv) +
                      " is not a multiple of 8 in [8, 256]");
  }
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.out)) {
    reasons.push_back("q, k, v and out must start on 16-byte boundaries");
  }
  check_strides(reasons, "q", p.q_stride);
  check_strides(reasons, "k", p.k_stride);
  check_strides(reasons, "v", p.v_stride);
  check_strides(reasons, "out", p.out_stride);
  if (packed_layout(p)) {  // grid: (query tiles of all sequences, Hq), 128-row tiles
    if (p.Hq > 65535) {
      reasons.push_back("Hq = " + std::to_string(p.Hq) +
                        " exceeds the grid's 65535 heads of a packed call");
    }
    if (varlen_tile_bound(p.total_q, p.B, p.Lq, 128) > 0x7FFFFFFFll) {
      reasons.push_back(std::to_string(p.B) + " sequences of " + std::to_string(p.total_q) +
                        " query rows exceed the grid's 2^31 - 1 query tiles");
    }
  } else {  // grid: (B·Hq, query blocks)
    if (static_cast<std::int64_t>(p.B) * p.Hq > 0x7FFFFFFFll) {
      reasons.push_back("B·Hq = " + std::to_string(static_cast<std::int64_t>(p.B) * p.Hq) +
                        " exceeds the grid's 2^31 - 1 blocks");
    }
    if (p.Lq > 65535ll * 128) {
      reasons.push_back("Lq = " + std::to_string(p.Lq) + " exceeds 65535 query blocks of 128 rows");
    }
  }
  if (p.group <= 0 || p.Hkv <= 0 || p.Hq != p.Hkv * p.group) {
    reasons.push_back("Hq must be a multiple of Hkv (GQA group)");
  }
  return reasons;
}

void launch_forward(const ForwardParams& params, ElemType type, cudaStream_t stream) {
  if (params.Lq == 0 || params.B == 0 || params.Hq == 0) return;
  const int bucket = head_dim_bucket(kForwardHeadDims, params.D > params.Dv ? params.D : params.Dv);
  const bool bf16 = type == ElemType::bf16;
  switch (bucket) {
    case 64:
      bf16 ? run_forward<__nv_bfloat16, 64>(params, stream) : run_forward<__half, 64>(params, stream);
      break;
    case 128:
      bf16 ? run_forward<__nv_bfloat16, 128>(params, stream) : run_forward<__half, 128>(params, stream);
      break;
    case 256:
      bf16 ? run_forward<__nv_bfloat16, 256>(params, stream) : run_forward<__half, 256>(params, stream);
      break;
    default:
      throw Error(ErrorCode::unsupported, "cuda forward: head dims D = " + std::to_string(params.D) +
                                              ", Dv = " + std::to_string(params.Dv) +
                                              " have no kernel (multiples of 8 up to 256)");
  }
}

}  // namespace memeff::cuda
