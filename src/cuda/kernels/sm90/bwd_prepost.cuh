// The small kernels around the sm90 backward's main kernel that only its layouts need: the
// packed calls' preprocess (delta and lse·log2(e) into each sequence's own query-block-padded
// workspace blocks; dense calls use common/bwd_prepost.cuh's) and the conversion of the fp32 dQ
// workspace (in the order the consumer warpgroups hold it) into dq in its own dtype and strides.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/softmax.cuh"
#include "cuda/kernels/common/types.cuh"
#include "cuda/kernels/common/varlen.cuh"
#include "cuda/kernels/sm90/bwd_traits.cuh"

namespace memeff::cuda::sm90 {

// The preprocess of packed calls (common/bwd_prepost.cuh's kernel for their layout): delta =
// delta_scale·rowsum(dO ∘ O) and lse·log2(e) (+inf past the sequence's end and for rows without a
// visible key). One CTA per (query tile, head) of the tile scheduler over the sequences'
// kBlockM-row blocks, each warp finding the tile itself; it fills the whole
// workspace block (packed_block0 in bwd_traits.cuh) of that tile, the rows past the sequence's end
// as padding, so the main kernel never reads a row another sequence owns. Grid (tiles, heads),
// heads past 65535 looped.
template <class T, int kLanes, int kBlockM>
__global__ void bwd_preprocess_packed_kernel(BackwardParams p, float* lse_log2, int m_blocks,
                                             float delta_scale) {
  constexpr int kRowsPerPass = 256 / kLanes;
  const VarlenTile tile = varlen_tile(p.cu_seqlens_q, p.B, p.total_q, p.Lq, kBlockM,
                                      static_cast<std::int64_t>(blockIdx.x));
  if (tile.seq >= p.B) return;
  const SeqSpan span = seq_span(p, tile.seq);
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const std::int64_t block = packed_block0(span.q0, tile.seq, kBlockM) + tile.block;
  for (int h = static_cast<int>(blockIdx.y); h < p.Hq; h += static_cast<int>(gridDim.y)) {
    const T* o = static_cast<const T*>(p.out) + h * p.out_stride.h + span.q0 * p.out_stride.l;
    const T* d = static_cast<const T*>(p.dout) + h * p.dout_stride.h + span.q0 * p.dout_stride.l;
    const float* lse = p.lse + h * p.lse_stride_h + span.q0;
    for (int r = static_cast<int>(threadIdx.x) / kLanes; r < kBlockM; r += kRowsPerPass) {
      const std::int64_t i = static_cast<std::int64_t>(tile.block) * kBlockM + r;
      float acc = 0.f, l2 = INFINITY;
      if (i < span.Lq) {
        acc = row_dot_share(o + i * p.out_stride.l, d + i * p.dout_stride.l, p.Dv, lane, kLanes);
        l2 = lse[i] == -INFINITY ? INFINITY : lse[i] * kLog2e;
      }
#pragma unroll
      for (int s = kLanes / 2; s > 0; s >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, s);
      if (lane == 0) {
        const std::int64_t row = (static_cast<std::int64_t>(h) * m_blocks + block) * kBlockM + r;
        p.softmax_d[row] = acc * delta_scale;
        lse_log2[row] = l2;
      }
    }
  }
}

// dq = dq_scale · dq_accum in the output dtype and strides (dq_scale: the softmax scale, times
// keep_scale with dropout, see bwd_kernel.cuh). The workspace holds, per (bh, query
// block, consumer warpgroup), a 64 x 64 block in the order that warpgroup holds it: float4 number
// f·128 + thread is the thread's accumulators of n8 tile f, rows 16·warp + g and + 8, columns
// 8f + 2t and + 1 (thread = 32·warp + 4g + t). A block of 256 threads converts one such block;
// grid (2·m_blocks, heads), heads past 65535 looped. The wide tile (kChunks = 4, BwdWideTraits)
// has four 64 x 64 blocks per query block, by head-dim columns, in the same order: grid
// (4·m_blocks, heads).
//
// Each warp converts four of the block's 32 row pairs (warp, g); its lane 4f + t loads the float4
// of (f, warp, g, t), so a load reads eight 64-byte runs, and holds columns 8f + 2t and + 1 of
// both rows: one store of the 32 lanes writes a whole 64-column row, 128 bytes. (Lanes holding
// one row's 16 bytes each, from different warps, left half-written 32-byte sectors to L2 and
// wrote a quarter more than dq to DRAM.)
//
// Packed calls (kPacked): grid (2·query tiles, heads); x / 2 is a tile of the scheduler over the
// sequences' kBlockM-row blocks (each warp finds it), read from the sequence's workspace blocks
// (packed_block0) and written to its packed rows; rows past its end are never written.
template <class T, int kBlockM, bool kSplitRows, bool kPacked = false, int kChunks = 2>
__global__ void bwd_convert_dq_kernel(BackwardParams p, const float* dq_accum, int m_blocks,
                                      float dq_scale) {
  static_assert(kChunks == 2 || (!kSplitRows && !kPacked), "four chunks: by columns, dense");
  constexpr int kPairs = 4;  // row pairs per warp
  const int wg = static_cast<int>(blockIdx.x) % kChunks;  // the block's chunk
  const int lane = static_cast<int>(threadIdx.x) & 31, wb = static_cast<int>(threadIdx.x) >> 5;
  const int f = lane >> 2, t = lane & 3;
  const int warp = wb >> 1, g0 = 4 * (wb & 1);  // row pairs (warp, g0 + j), j < kPairs
  const int col = (kSplitRows ? 0 : 64 * wg) + 8 * f + 2 * t;
  // D is a multiple of 8 (the sm90 family's requirement), so col < D covers col + 1 too.
  const bool col_in = col < p.D;
  int m = static_cast<int>(blockIdx.x) / kChunks;
  std::int64_t Lq = p.Lq, q0 = 0, block0 = 0;  // the sequence (dense: the batch entry)
  if constexpr (kPacked) {
    const VarlenTile tile = varlen_tile(p.cu_seqlens_q, p.B, p.total_q, p.Lq, kBlockM, m);
    if (tile.seq >= p.B) return;
    const SeqSpan span = seq_span(p, tile.seq);
    m = tile.block;
    Lq = span.Lq;
    q0 = span.q0;
    block0 = packed_block0(span.q0, tile.seq, kBlockM);
  }
  const std::int64_t i0 = static_cast<std::int64_t>(m) * kBlockM + (kSplitRows ? 64 * wg : 0) +
                          16 * warp + g0;  // row of pair j: i0 + j, and + 8
  const int heads = kPacked ? p.Hq : p.B * p.Hq;
  for (int bh = static_cast<int>(blockIdx.y); bh < heads; bh += static_cast<int>(gridDim.y)) {
    const int h = bh % p.Hq, b = bh / p.Hq;
    const std::int64_t block =
        (static_cast<std::int64_t>(bh) * m_blocks + block0 + m) * kChunks + wg;
    const float4* src = reinterpret_cast<const float4*>(dq_accum + block * 64 * 64) +
                        (f * 128 + 32 * warp + 4 * g0 + t);
    float4 v[kPairs];
#pragma unroll
    for (int j = 0; j < kPairs; ++j) v[j] = src[4 * j];
    T* dq =
        static_cast<T*>(p.dq) + b * p.dq_stride.b + h * p.dq_stride.h + q0 * p.dq_stride.l + col;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const std::int64_t i = i0 + j;
      if (col_in && i < Lq) {
        *reinterpret_cast<std::uint32_t*>(dq + i * p.dq_stride.l) =
            pack2<T>(v[j].x * dq_scale, v[j].y * dq_scale);
      }
      if (col_in && i + 8 < Lq) {
        *reinterpret_cast<std::uint32_t*>(dq + (i + 8) * p.dq_stride.l) =
            pack2<T>(v[j].z * dq_scale, v[j].w * dq_scale);
      }
    }
  }
}

}  // namespace memeff::cuda::sm90
