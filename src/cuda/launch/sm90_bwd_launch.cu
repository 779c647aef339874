// sm90 backward launcher: the reasons the Hopper backward cannot run a problem, its workspace,
// the TMA descriptors of q and dout (packed calls: of the packed tensors), and the pick of the
// dtype x head-dim instantiation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/varlen.cuh"
#include "cuda/launch/launch.h"
#include "cuda/launch/launch_checks.h"
#include "cuda/sm90/bwd_dispatch.cuh"
#include "cuda/sm90/tma.h"
#include "memeff/error.h"

namespace memeff::cuda {

namespace {

int backward_bucket(const BackwardParams& p) {
  return head_dim_bucket(sm90::kBackwardHeadDims, p.D > p.Dv ? p.D : p.Dv);
}

}  // namespace

std::vector<std::string> sm90_backward_unsupported(const BackwardParams& p, int sm_major,
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
  if (p.D <= 0 || p.D % 8 != 0 || p.Dv <= 0 || p.Dv % 8 != 0 || backward_bucket(p) == 0) {
    reasons.push_back("head dims D = " + std::to_string(p.D) + ", Dv = " + std::to_string(p.Dv) +
                      ": the Hopper backward has tiles for multiples of 8 up to 128 (the cuda "
                      "backend runs larger ones)");
  }
  check_aligned16(reasons, {p.q, p.k, p.v, p.out, p.dout, p.dq, p.dk, p.dv},
                  "q, k, v, out, dout, dq, dk and dv must start on 16-byte boundaries (TMA, "
                  "16-byte stores)");
  check_strides(reasons, "q", p.q_stride);
  check_strides(reasons, "k", p.k_stride);
  check_strides(reasons, "v", p.v_stride);
  check_strides(reasons, "out", p.out_stride);
  check_strides(reasons, "dout", p.dout_stride);
  check_strides(reasons, "dq", p.dq_stride);
  check_strides(reasons, "dk", p.dk_stride);
  check_strides(reasons, "dv", p.dv_stride);
  if (p.group <= 0 || p.Hkv <= 0 || p.Hq != p.Hkv * p.group) {
    reasons.push_back("Hq must be a multiple of Hkv (GQA group)");
  }
  if (packed) {
    // Grids (key tiles, Hkv) and (2·query tiles, heads); per head total_q / 64 + S workspace
    // blocks counted in int.
    if (p.Hkv > 65535) {
      reasons.push_back("Hkv = " + std::to_string(p.Hkv) + " exceeds the grid's 65535 kv heads");
    }
    const std::int64_t key_tiles = varlen_tile_bound(p.total_k, p.B, p.Lk, sm90::kBackwardBlockN);
    const std::int64_t query_tiles = varlen_tile_bound(p.total_q, p.B, p.Lq, 64);
    if (key_tiles > 0x7FFFFFFFll || 2 * query_tiles > 0x7FFFFFFFll ||
        p.total_q / 64 + p.B > 0x7FFFFFFFll) {
      reasons.push_back("the packed sequences' tiles exceed the grid's 2^31 - 1");
    }
  } else if (static_cast<std::int64_t>(p.B) * p.Hkv > 65535) {
    reasons.push_back("B·Hkv = " + std::to_string(static_cast<std::int64_t>(p.B) * p.Hkv) +
                      " exceeds the grid's 65535 (batch, kv head) blocks");
  }
  if (p.Lq > 0x7FFFFFFFll) {
    reasons.push_back("Lq = " + std::to_string(p.Lq) + " exceeds TMA's 32-bit coordinates");
  }
  if (p.Lk > 0x7FFFFFFFll - sm90::kBackwardBlockN) {
    reasons.push_back("Lk = " + std::to_string(p.Lk) + " exceeds the kernel's 32-bit key blocks");
  }
  return reasons;
}

std::size_t sm90_backward_workspace_bytes(const BackwardParams& p, bool packed) {
  return sm90::backward_workspace_layout(p, backward_bucket(p), packed || p.cu_seqlens_q != nullptr)
      .total;
}

namespace {

template <int kHeadDim>
void run_bucket(const sm90::BackwardTmaParams& tp, const sm90::BwdWorkspace& ws, bool bf16,
                cudaStream_t stream) {
  bf16 ? sm90::run_backward<__nv_bfloat16, kHeadDim>(tp, ws, stream)
       : sm90::run_backward<__half, kHeadDim>(tp, ws, stream);
}

}  // namespace

void launch_backward_sm90(const BackwardParams& params, void* workspace, ElemType type,
                          cudaStream_t stream) {
  if (params.B == 0 || params.Hq == 0 || params.Lq == 0 || params.Lk == 0) {
    throw Error(ErrorCode::internal,
                "cuda_sm90 backward: empty problems are handled by the backend, not the kernels");
  }
  const int bucket = backward_bucket(params);
  const int block_m = sm90::backward_block_m(bucket);
  if (block_m == 0) {
    throw Error(ErrorCode::unsupported,
                "cuda_sm90 backward: head dims D = " + std::to_string(params.D) +
                    ", Dv = " + std::to_string(params.Dv) + " have no kernel");
  }
  const bool packed = params.cu_seqlens_q != nullptr;
  const sm90::BwdWorkspace ws = sm90::backward_workspace_layout(params, bucket, packed);
  if (workspace == nullptr) {
    throw Error(ErrorCode::invalid_argument, "argument `workspace`: the cuda_sm90 backward needs " +
                                                 std::to_string(ws.total) +
                                                 " bytes, got a null pointer");
  }
  auto* base = static_cast<unsigned char*>(workspace);
  const bool bf16 = type == ElemType::bf16;
  sm90::BackwardTmaParams tp{};
  tp.p = params;
  tp.p.softmax_d = reinterpret_cast<float*>(base + ws.delta);
  tp.p.dq_accum = reinterpret_cast<float*>(base + ws.dq_accum);
  tp.lse_log2 = reinterpret_cast<float*>(base + ws.lse_log2);
  tp.dq_turn = reinterpret_cast<int*>(base + ws.dq_turn);
  tp.dbias_accum = ws.dbias_mode == 2 ? reinterpret_cast<float*>(base + ws.dbias_accum) : nullptr;
  tp.dbias_mode = ws.dbias_mode;
  tp.lq_pad = ws.lq_pad;
  tp.m_blocks = ws.m_blocks;
  if (packed) {
    tp.packed_q_tiles =
        static_cast<int>(varlen_tile_bound(params.total_q, params.B, params.Lq, block_m));
  }
  auto map_of = [&](const void* data, int D, const Strides& s) {
    return packed ? sm90::tma_tensor_packed(data, bf16, params.Hq, params.total_q, D, s)
                  : sm90::tma_tensor(data, bf16, params.B, params.Hq, params.Lq, D, s);
  };
  sm90::encode_tma_4d_or_throw(tp.q, map_of(params.q, params.D, params.q_stride), block_m,
                               "cuda_sm90 backward: `q`");
  sm90::encode_tma_4d_or_throw(tp.dout, map_of(params.dout, params.Dv, params.dout_stride), block_m,
                               "cuda_sm90 backward: `dout`");
  switch (bucket) {
    case 64:
      run_bucket<64>(tp, ws, bf16, stream);
      break;
    case 128:
      run_bucket<128>(tp, ws, bf16, stream);
      break;
    default:
      break;
  }
}

}  // namespace memeff::cuda
