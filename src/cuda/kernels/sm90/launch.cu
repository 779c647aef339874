// The sm90 family's host interface (family.h): the reasons the Hopper kernels cannot run params
// (the checks shared with sm80 in common/reasons.h, then their own device, grid and TMA bounds),
// the backward's workspace, the TMA descriptors of the tensors they load in boxes (packed calls:
// of the packed tensors, with the tile scheduler's grid bound), and the pick of the dtype x
// head-dim instantiation.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/kernels/common/instances.cuh"
#include "cuda/kernels/common/varlen.cuh"
#include "cuda/kernels/sm90/family.h"
#include "cuda/kernels/sm90/instances.h"
#include "cuda/kernels/sm90/tma.h"
#include "memeff/error.h"

namespace memeff::cuda::sm90 {

bool kernels_built() {
#if defined(MEMEFF_CUDA_SM90A)
  return true;
#else
  return false;
#endif
}

namespace {

// TMA's coordinates are 32-bit.
constexpr std::int64_t kMaxTmaRows = kMaxGridX;

void add_device_reasons(std::vector<std::string>& reasons, const DeviceCaps& dev) {
  if (!kernels_built()) {
    reasons.push_back("this build has no sm_90a code (CMAKE_CUDA_ARCHITECTURES without 90a)");
  }
  if (dev.major != 9 || dev.minor != 0) {
    reasons.push_back("needs compute capability 9.0 (sm_90a: wgmma, TMA, setmaxnreg); device has " +
                      std::to_string(dev.major) + "." + std::to_string(dev.minor));
  }
}

int forward_bucket(const ForwardParams& p) {
  return ForwardHeadDims::bucket_of(std::max(p.D, p.Dv));
}
int backward_bucket(const ForwardParams& p) {
  return BackwardHeadDims::bucket_of(std::max(p.D, p.Dv));
}

// The TMA map of a bias the kernels can load in tiles of box_rows queries by 64 keys: 16-bit
// (the inputs' dtype), varying over queries, with a base and row, head and batch strides the
// driver accepts (16-byte aligned: Lk a multiple of 8 when contiguous); a broadcast batch or head
// is a dimension of one. False, with `map` unused, for any other bias: the kernels then read it
// per score.
bool encode_bias_tiles(CUtensorMap& map, const ForwardParams& p, bool bf16, int box_rows) {
  if (p.bias == nullptr || p.bias_is_fp32 || p.bias_stride.l == 0) return false;
  const Strides& s = p.bias_stride;
  const TmaTensor bias{p.bias, bf16, s.b != 0 ? p.B : 1, s.h != 0 ? p.Hq : 1, p.Lq, p.Lk, s.b,
                       s.h,    s.l};
  return encode_tma_4d(map, bias, box_rows).empty();
}

[[noreturn]] void no_kernel(const char* pass, const ForwardParams& p) {
  throw Error(ErrorCode::unsupported, std::string("cuda_sm90 ") + pass +
                                          ": head dims D = " + std::to_string(p.D) +
                                          ", Dv = " + std::to_string(p.Dv) + " have no kernel");
}

}  // namespace

std::vector<std::string> Family::forward_reasons(const ForwardParams& p, const DeviceCaps& dev) {
  std::vector<std::string> reasons;
  add_device_reasons(reasons, dev);
  add_common_reasons(reasons, p, ForwardHeadDims::largest, " (TMA)");
  add_score_modifier_reasons(reasons, p);
  const int block_m = forward_tile(forward_bucket(p)).block_m;  // 0: no bucket (said above)
  if (block_m > 0 && packed_layout(p)) {  // one CTA per (query tile, head) of the scheduler
    const std::int64_t ctas = varlen_tile_bound(p.total_q, p.B, p.Lq, block_m) * p.Hq;
    if (ctas > kMaxGridX) {
      reasons.push_back(std::to_string(ctas) +
                        " (query tile, head) pairs of the packed sequences exceed the grid's "
                        "2^31 - 1");
    }
  } else if (block_m > 0) {  // one work item per (query block, batch·head)
    const std::int64_t query_blocks =
        (p.Lq + block_m - 1) / block_m * static_cast<std::int64_t>(p.B) * p.Hq;
    if (query_blocks > kMaxGridX) {
      reasons.push_back("ceil(Lq / " + std::to_string(block_m) + ")·B·Hq = " +
                        std::to_string(query_blocks) + " query blocks exceed the grid's 2^31 - 1");
    }
  }
  if (p.Lq > kMaxTmaRows) {
    reasons.push_back("Lq = " + std::to_string(p.Lq) + " exceeds TMA's 32-bit coordinates");
  }
  if (p.Lk > kMaxTmaRows) {
    reasons.push_back("Lk = " + std::to_string(p.Lk) + " exceeds TMA's 32-bit coordinates");
  }
  return reasons;
}

// The dynamic walk's counter and item slots (fwd_run.cuh) for dense calls whose items differ in
// cost.
std::size_t Family::forward_workspace_bytes(const ForwardParams& p) {
  return !packed_layout(p) && block_costs_vary(p) ? kForwardWalkBytes : 0;
}

void Family::forward(const ForwardParams& params, void* workspace, ElemType type,
                     const DeviceCaps& dev, cudaStream_t stream) {
  if (params.Lq == 0 || params.B == 0 || params.Hq == 0) return;
  const int bucket = forward_bucket(params);
  // The Q box is the kernel's item: run_forward picks the wide tile by the same rule.
  const ForwardTile tile = forward_tile(bucket, forward_takes_wide_tile(params, bucket));
  if (tile.block_m == 0) no_kernel("forward", params);
  const bool bf16 = type == ElemType::bf16;
  ForwardTmaParams tp{};
  tp.p = params;
  const bool packed = params.cu_seqlens_q != nullptr;
  if (forward_workspace_bytes(params) > 0) {
    if (workspace == nullptr) {
      throw Error(ErrorCode::invalid_argument,
                  "argument `workspace`: the cuda_sm90 forward needs " +
                      std::to_string(forward_workspace_bytes(params)) +
                      " bytes, got a null pointer");
    }
    tp.item_counter = static_cast<int*>(workspace);
    tp.item_slots = tp.item_counter + 4;
  }
  auto map_of = [&](const void* data, int H, std::int64_t L, int D, const Strides& s,
                    std::int64_t total) {
    return packed ? tma_tensor_packed(data, bf16, H, total, D, s)
                  : tma_tensor(data, bf16, params.B, H, L, D, s);
  };
  if (packed) {
    tp.packed_tiles =
        static_cast<int>(varlen_tile_bound(params.total_q, params.B, params.Lq, tile.block_m));
  }
  encode_tma_4d_or_throw(
      tp.q, map_of(params.q, params.Hq, params.Lq, params.D, params.q_stride, params.total_q),
      tile.block_m, "cuda_sm90 forward: `q`");
  // With no keys the kernel loads only Q (packed: Lk, the longest sequence's keys, is at most
  // total_k, so Lk > 0 leaves a map of at least one row).
  if (params.Lk > 0) {
    encode_tma_4d_or_throw(
        tp.k, map_of(params.k, params.Hkv, params.Lk, params.D, params.k_stride, params.total_k),
        tile.block_n, "cuda_sm90 forward: `k`");
    encode_tma_4d_or_throw(
        tp.v, map_of(params.v, params.Hkv, params.Lk, params.Dv, params.v_stride, params.total_k),
        tile.block_n, "cuda_sm90 forward: `v`");
  }
  // A 16-bit bias that varies over queries comes in tiles (fwd_run.cuh picks the kernel).
  if (!packed && params.Lk > 0) {
    tp.bias_tiles = encode_bias_tiles(tp.bias, params, bf16, tile.block_m);
  }
  switch_instance(ForwardHeadDims{}, type, bucket, [&](auto inst) {
    using I = decltype(inst);
    run_forward<typename I::T, I::kHeadDim>(tp, dev.multiprocessors, stream);
  });
}

std::vector<std::string> Family::backward_reasons(const BackwardParams& p, const DeviceCaps& dev) {
  std::vector<std::string> reasons;
  add_device_reasons(reasons, dev);
  add_common_reasons(reasons, p, BackwardHeadDims::largest, " (TMA, 16-byte stores)", 8);
  add_score_modifier_reasons(reasons, p);
  if (packed_layout(p)) {
    // Grids (key tiles, Hkv) and (2·query tiles, heads); per head total_q / 64 + S workspace
    // blocks counted in int.
    if (p.Hkv > kMaxGridY) {
      reasons.push_back("Hkv = " + std::to_string(p.Hkv) + " exceeds the grid's 65535 kv heads");
    }
    const std::int64_t key_tiles = varlen_tile_bound(p.total_k, p.B, p.Lk, kBackwardBlockN);
    const std::int64_t query_tiles = varlen_tile_bound(p.total_q, p.B, p.Lq, kBackwardMinBlockM);
    if (key_tiles > kMaxGridX || 2 * query_tiles > kMaxGridX ||
        p.total_q / kBackwardMinBlockM + p.B > kMaxGridX) {
      reasons.push_back("the packed sequences' tiles exceed the grid's 2^31 - 1");
    }
  } else {
    add_dense_backward_grid_reasons(reasons, p, backward_block_n(backward_bucket(p)));
  }
  if (backward_bucket(p) == BwdWideTraits::kHeadDim) {
    // The wide tile (bwd_wide_kernel.cuh) has the plain dense step only.
    const std::string dims = "head dims above 128 (D = " + std::to_string(p.D) +
                             ", Dv = " + std::to_string(p.Dv) + ") run on the wide tile, which ";
    // A bias: its pointer with views; params from the problem alone (dispatch) have its dbias
    // shape instead.
    if (p.bias != nullptr || p.dbias_shape[0] > 0) reasons.push_back(dims + "takes no bias");
    if (p.mods.flags != 0) reasons.push_back(dims + "takes no window, ALiBi or softcap");
    if (packed_layout(p)) reasons.push_back(dims + "takes no packed sequences");
  }
  if (p.Lq > kMaxTmaRows) {
    reasons.push_back("Lq = " + std::to_string(p.Lq) + " exceeds TMA's 32-bit coordinates");
  }
  if (p.Lk > kMaxTmaRows - kBackwardBlockN) {
    reasons.push_back("Lk = " + std::to_string(p.Lk) + " exceeds the kernel's 32-bit key blocks");
  }
  return reasons;
}

std::size_t Family::backward_workspace_bytes(const BackwardParams& p) {
  return backward_workspace_layout(p, backward_bucket(p)).total;
}

void Family::backward(const BackwardParams& params, void* workspace, ElemType type,
                      const DeviceCaps& dev, cudaStream_t stream) {
  if (params.B == 0 || params.Hq == 0 || params.Lq == 0 || params.Lk == 0) {
    throw Error(ErrorCode::internal,
                "cuda_sm90 backward: empty problems are handled by the backend, not the kernels");
  }
  const int bucket = backward_bucket(params);
  const int block_m = backward_block_m(bucket);
  if (block_m == 0) no_kernel("backward", params);
  const bool packed = params.cu_seqlens_q != nullptr;
  const BackwardWorkspace ws = backward_workspace_layout(params, bucket);
  if (workspace == nullptr) {
    throw Error(ErrorCode::invalid_argument, "argument `workspace`: the cuda_sm90 backward needs " +
                                                 std::to_string(ws.total) +
                                                 " bytes, got a null pointer");
  }
  auto* base = static_cast<unsigned char*>(workspace);
  const bool bf16 = type == ElemType::bf16;
  BackwardTmaParams tp{};
  tp.p = params;
  tp.p.softmax_d = reinterpret_cast<float*>(base + ws.delta);
  tp.p.dq_accum = reinterpret_cast<float*>(base + ws.dq_accum);
  tp.lse_log2 = reinterpret_cast<float*>(base + ws.lse_log2);
  tp.dq_turn = reinterpret_cast<int*>(base + ws.dq_turn);
  tp.dbias_accum = ws.dbias.mode == DbiasMode::reduced
                       ? reinterpret_cast<float*>(base + ws.dbias_accum)
                       : nullptr;
  tp.dbias_mode = ws.dbias.mode;
  tp.lq_pad = ws.lq_pad;
  tp.m_blocks = ws.m_blocks;
  if (packed) {
    tp.packed_q_tiles =
        static_cast<int>(varlen_tile_bound(params.total_q, params.B, params.Lq, block_m));
  }
  auto map_of = [&](const void* data, int D, const Strides& s) {
    return packed ? tma_tensor_packed(data, bf16, params.Hq, params.total_q, D, s)
                  : tma_tensor(data, bf16, params.B, params.Hq, params.Lq, D, s);
  };
  encode_tma_4d_or_throw(tp.q, map_of(params.q, params.D, params.q_stride), block_m,
                         "cuda_sm90 backward: `q`");
  encode_tma_4d_or_throw(tp.dout, map_of(params.dout, params.Dv, params.dout_stride), block_m,
                         "cuda_sm90 backward: `dout`");
  // A 16-bit bias that varies over queries comes in tiles of 64 queries by 64 keys.
  if (!packed) tp.bias_tiles = encode_bias_tiles(tp.bias, params, bf16, 64);
  switch_instance(BackwardHeadDims{}, type, bucket, [&](auto inst) {
    using I = decltype(inst);
    if constexpr (I::kHeadDim == BwdWideTraits::kHeadDim) {
      run_backward_wide<typename I::T>(tp, ws, dev.multiprocessors, stream);
    } else {
      run_backward<typename I::T, I::kHeadDim>(tp, ws, dev.multiprocessors, stream);
    }
  });
}

}  // namespace memeff::cuda::sm90
