// sm90 forward launcher: the reasons the Hopper forward cannot run a problem, the TMA descriptors
// of q, k and v (packed calls: of the packed tensors, and the tile scheduler's grid bound), and
// the pick of the dtype x head-dim instantiation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/varlen.cuh"
#include "cuda/launch/launch.h"
#include "cuda/launch/launch_checks.h"
#include "cuda/sm90/fwd_dispatch.cuh"
#include "cuda/sm90/tma.h"
#include "memeff/error.h"

namespace memeff::cuda {

bool sm90_kernels_built() {
#if defined(MEMEFF_CUDA_SM90A)
  return true;
#else
  return false;
#endif
}

namespace {

// Query tiles per head of a packed call's grid (the scheduler's bound for the bucket's blocks).
std::int64_t packed_query_tiles(const ForwardParams& p, int block_m) {
  return varlen_tile_bound(p.total_q, p.B, p.Lq, block_m);
}

int forward_bucket(const ForwardParams& p) {
  return head_dim_bucket(sm90::kForwardHeadDims, p.D > p.Dv ? p.D : p.Dv);
}

}  // namespace

std::vector<std::string> sm90_forward_unsupported(const ForwardParams& p, int sm_major,
                                                  int sm_minor, bool packed) {
  packed = packed || p.cu_seqlens_q != nullptr;
  std::vector<std::string> reasons;
  if (!sm90_kernels_built()) {
    reasons.push_back("this build has no sm_90a code (CMAKE_CUDA_ARCHITECTURES without 90a)");
  }
  if (sm_major != 9 || sm_minor != 0) {
    reasons.push_back("needs compute capability 9.0 (sm_90a: wgmma, TMA, setmaxnreg); device has " +
                      std::to_string(sm_major) + "." + std::to_string(sm_minor));
  }
  if (p.D <= 0 || p.D % 8 != 0 || head_dim_bucket(sm90::kForwardHeadDims, p.D) == 0) {
    reasons.push_back("head dim D = " + std::to_string(p.D) +
                      " is not a multiple of 8 in [8, 256]");
  }
  if (p.Dv <= 0 || p.Dv % 8 != 0 || head_dim_bucket(sm90::kForwardHeadDims, p.Dv) == 0) {
    reasons.push_back("value head dim Dv = " + std::to_string(p.Dv) +
                      " is not a multiple of 8 in [8, 256]");
  }
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.out)) {
    reasons.push_back("q, k, v and out must start on 16-byte boundaries (TMA)");
  }
  check_strides(reasons, "q", p.q_stride);
  check_strides(reasons, "k", p.k_stride);
  check_strides(reasons, "v", p.v_stride);
  check_strides(reasons, "out", p.out_stride);
  if (packed) {
    const int block_m = sm90::forward_tile(forward_bucket(p)).block_m;
    const std::int64_t ctas = packed_query_tiles(p, block_m > 0 ? block_m : 64) * p.Hq;
    if (ctas > 0x7FFFFFFFll) {
      reasons.push_back(std::to_string(ctas) +
                        " (query tile, head) pairs of the packed sequences exceed the grid's "
                        "2^31 - 1");
    }
  } else {
    const std::int64_t query_blocks = (p.Lq + 63) / 64 * static_cast<std::int64_t>(p.B) * p.Hq;
    if (query_blocks > 0x7FFFFFFFll) {
      reasons.push_back("ceil(Lq / 64)·B·Hq = " + std::to_string(query_blocks) +
                        " query blocks exceed the grid's 2^31 - 1");
    }
  }
  if (p.Lq > 0x7FFFFFFFll) {
    reasons.push_back("Lq = " + std::to_string(p.Lq) + " exceeds TMA's 32-bit coordinates");
  }
  if (p.Lk > 0x7FFFFFFFll) {
    reasons.push_back("Lk = " + std::to_string(p.Lk) + " exceeds TMA's 32-bit coordinates");
  }
  if (p.group <= 0 || p.Hkv <= 0 || p.Hq != p.Hkv * p.group) {
    reasons.push_back("Hq must be a multiple of Hkv (GQA group)");
  }
  return reasons;
}

namespace {

template <int kHeadDim>
void run_bucket(const sm90::ForwardTmaParams& tp, bool bf16, int multiprocessors,
                cudaStream_t stream) {
  bf16 ? sm90::run_forward<__nv_bfloat16, kHeadDim>(tp, multiprocessors, stream)
       : sm90::run_forward<__half, kHeadDim>(tp, multiprocessors, stream);
}

}  // namespace

void launch_forward_sm90(const ForwardParams& params, ElemType type, int multiprocessors,
                         cudaStream_t stream) {
  if (params.Lq == 0 || params.B == 0 || params.Hq == 0) return;
  const int bucket = forward_bucket(params);
  const sm90::ForwardTile tile = sm90::forward_tile(bucket);
  if (tile.block_m == 0) {
    throw Error(ErrorCode::unsupported,
                "cuda_sm90 forward: head dims D = " + std::to_string(params.D) + ", Dv = " +
                    std::to_string(params.Dv) + " have no kernel (multiples of 8 up to 256)");
  }
  const bool bf16 = type == ElemType::bf16;
  sm90::ForwardTmaParams tp{};
  tp.p = params;
  const bool packed = params.cu_seqlens_q != nullptr;
  auto map_of = [&](const void* data, int H, std::int64_t L, int D, const Strides& s,
                    std::int64_t total) {
    return packed ? sm90::tma_tensor_packed(data, bf16, H, total, D, s)
                  : sm90::tma_tensor(data, bf16, params.B, H, L, D, s);
  };
  if (packed) tp.packed_tiles = static_cast<int>(packed_query_tiles(params, tile.block_m));
  sm90::encode_tma_4d_or_throw(
      tp.q, map_of(params.q, params.Hq, params.Lq, params.D, params.q_stride, params.total_q),
      tile.block_m, "cuda_sm90 forward: `q`");
  // With no keys the kernel loads only Q (packed: Lk, the longest sequence's keys, is at most
  // total_k, so Lk > 0 leaves a map of at least one row).
  if (params.Lk > 0) {
    sm90::encode_tma_4d_or_throw(
        tp.k, map_of(params.k, params.Hkv, params.Lk, params.D, params.k_stride, params.total_k),
        tile.block_n, "cuda_sm90 forward: `k`");
    sm90::encode_tma_4d_or_throw(
        tp.v, map_of(params.v, params.Hkv, params.Lk, params.Dv, params.v_stride, params.total_k),
        tile.block_n, "cuda_sm90 forward: `v`");
  }
  switch (bucket) {
    case 64:
      run_bucket<64>(tp, bf16, multiprocessors, stream);
      break;
    case 96:
      run_bucket<96>(tp, bf16, multiprocessors, stream);
      break;
    case 128:
      run_bucket<128>(tp, bf16, multiprocessors, stream);
      break;
    case 256:
      run_bucket<256>(tp, bf16, multiprocessors, stream);
      break;
    default:
      break;
  }
}

}  // namespace memeff::cuda
