// Backward launcher: the workspace size, the reasons the fused backward cannot run a problem (the
// dispatcher prints them) and the choice of the dtype x head-dim instantiation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/varlen.cuh"
#include "cuda/launch/launch.h"
#include "cuda/launch/launch_checks.h"
#include "cuda/sm80/bwd_dispatch.cuh"
#include "memeff/error.h"

namespace memeff::cuda {

std::size_t backward_workspace_bytes(const BackwardParams& p) {
  return backward_workspace_layout(p).total;
}

std::vector<std::string> backward_unsupported(const BackwardParams& p, int sm_major, int sm_minor) {
  std::vector<std::string> reasons;
  if (sm_major < 8) {
    reasons.push_back("needs compute capability 8.0 or newer (mma.sync bf16, cp.async); device has " +
                      std::to_string(sm_major) + "." + std::to_string(sm_minor));
  }
  if (p.D <= 0 || p.D % 8 != 0 || head_dim_bucket(kBackwardHeadDims, p.D) == 0) {
    reasons.push_back("head dim D = " + std::to_string(p.D) + " is not a multiple of 8 in [8, 256]");
  }
  if (p.Dv <= 0 || p.Dv % 8 != 0 || head_dim_bucket(kBackwardHeadDims, p.Dv) == 0) {
    reasons.push_back("value head dim Dv = " + std::to_string(p.Dv) +
                      " is not a multiple of 8 in [8, 256]");
  }
  // Pointers are null when only the problem is known (dispatch); checked again with the views.
  check_aligned16(reasons, {p.q, p.k, p.v, p.out, p.dout, p.dq, p.dk, p.dv},
                  "q, k, v, out, dout, dq, dk and dv must start on 16-byte boundaries");
  check_strides(reasons, "q", p.q_stride);
  check_strides(reasons, "k", p.k_stride);
  check_strides(reasons, "v", p.v_stride);
  check_strides(reasons, "out", p.out_stride);
  check_strides(reasons, "dout", p.dout_stride);
  // dq, dk and dv are written two elements at a time.
  if (p.dq_stride.b % 2 || p.dq_stride.h % 2 || p.dq_stride.l % 2 || p.dk_stride.b % 2 ||
      p.dk_stride.h % 2 || p.dk_stride.l % 2 || p.dv_stride.b % 2 || p.dv_stride.h % 2 ||
      p.dv_stride.l % 2) {
    reasons.push_back("dq, dk and dv strides must be even (paired 4-byte stores)");
  }
  if (p.group <= 0 || p.Hkv <= 0 || p.Hq != p.Hkv * p.group) {
    reasons.push_back("Hq must be a multiple of Hkv (GQA group)");
  }
  if (packed_layout(p)) {  // grid: (key tiles of all sequences, or the sequences; Hkv)
    if (p.Hkv > 65535) {
      reasons.push_back("Hkv = " + std::to_string(p.Hkv) +
                        " exceeds the grid's 65535 kv heads of a packed call");
    }
    if (varlen_tile_bound(p.total_k, p.B, p.Lk, 64) > 0x7FFFFFFFll) {  // the smallest key block
      reasons.push_back(std::to_string(p.B) + " sequences of " + std::to_string(p.total_k) +
                        " key rows exceed the grid's 2^31 - 1 key tiles");
    }
  } else if (static_cast<std::int64_t>(p.B) * p.Hkv > 65535) {
    reasons.push_back("B·Hkv = " + std::to_string(static_cast<std::int64_t>(p.B) * p.Hkv) +
                      " exceeds the grid's 65535 (batch, kv head) blocks");
  }
  if (p.Lk > (std::int64_t{1} << 31) - 1 || p.Lq > (std::int64_t{1} << 31) - 1) {
    reasons.push_back("Lq and Lk must be below 2^31");
  }
  return reasons;
}

void launch_backward(BackwardParams params, void* workspace, ElemType type, cudaStream_t stream) {
  if (params.B == 0 || params.Hq == 0 || params.Lq == 0 || params.Lk == 0) {
    throw Error(ErrorCode::internal,
                "cuda backward: empty problems are handled by the backend, not the kernels");
  }
  if (workspace == nullptr) {
    throw Error(ErrorCode::invalid_argument, "argument `workspace`: the cuda backward needs " +
                                                 std::to_string(backward_workspace_bytes(params)) +
                                                 " bytes, got a null pointer");
  }
  const int bucket = head_dim_bucket(kBackwardHeadDims, params.D > params.Dv ? params.D : params.Dv);
  const bool bf16 = type == ElemType::bf16;
  switch (bucket) {
    case 64:
      bf16 ? run_backward<__nv_bfloat16, 64>(params, workspace, stream)
           : run_backward<__half, 64>(params, workspace, stream);
      break;
    case 128:
      bf16 ? run_backward<__nv_bfloat16, 128>(params, workspace, stream)
           : run_backward<__half, 128>(params, workspace, stream);
      break;
    case 256:
      bf16 ? run_backward<__nv_bfloat16, 256>(params, workspace, stream)
           : run_backward<__half, 256>(params, workspace, stream);
      break;
    default:
      throw Error(ErrorCode::unsupported, "cuda backward: head dims D = " + std::to_string(params.D) +
                                              ", Dv = " + std::to_string(params.Dv) +
                                              " have no kernel (multiples of 8 up to 256)");
  }
}

}  // namespace memeff::cuda
