// Tile shapes and workspace of the sm80 backward (bwd_kernel.cuh): the traits of one
// instantiation, the shape chosen per head-dim bucket and the layout of the fp32 workspace, what
// the launcher needs without the kernel.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/hostdevice.h"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/reasons.h"
#include "cuda/kernels/common/varlen.cuh"

namespace memeff::cuda::sm80 {

// Head-dim buckets with a compiled backward kernel; D and Dv up to the bucket are zero-padded.
using BackwardHeadDims = HeadDims<64, 128, 256>;

// Tile shape of the main kernel: kHeadDim = head-dim bucket (D and Dv zero-padded up to it),
// kBlockN keys per CTA (16 per warp, a multiple of 64 so dropout blocks align), kBlockM queries per
// step.
template <int kHeadDim_, int kBlockN_, int kBlockM_, int kMinBlocks_>
struct BwdTraits {
  static constexpr int kHeadDim = kHeadDim_, kBlockN = kBlockN_, kBlockM = kBlockM_,
                       kMinBlocks = kMinBlocks_;
  static constexpr int kWarps = kBlockN / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowPad =
      kHeadDim + 8;                           // smem row (elements) of K, V, Q, dO: +16 B vs banks
  static constexpr int kDsPad = kBlockM + 8;  // smem row of dSᵀ [key][query]
  static constexpr int kKeyBlocks64 = kBlockN / 64;
  // dQ = dS·K warp grid: kWarpsM row tiles of 16 queries, kWarpsN column slices of kHeadDim.
  static constexpr int kWarpsM = (kBlockM / 16) < kWarps ? (kBlockM / 16) : kWarps;
  static constexpr int kWarpsN = kWarps / kWarpsM;
  static constexpr int kDqCols = kHeadDim / kWarpsN;  // columns of dQ per warp
  static_assert(kBlockN % 64 == 0, "key block must cover whole 64-key dropout blocks");
  static_assert(kBlockM % 16 == 0 && kHeadDim % 16 == 0, "tiles are multiples of 16");
  static_assert(kWarpsM * kWarpsN == kWarps && kDqCols % 16 == 0, "dQ warp grid");
  // Shared memory (bytes): K, V, two buffers of Q and dO, dSᵀ, then per-buffer lse, delta and
  // dropout keep bits.
  static constexpr int kKvBytes = kBlockN * kRowPad * 2;
  static constexpr int kQBytes = kBlockM * kRowPad * 2;
  static constexpr int kDsBytes = kBlockN * kDsPad * 2;
  static constexpr int kScalarBytes = kBlockM * 4;
  static constexpr int kKeepBytes =
      kKeyBlocks64 * kBlockM * 4 * 2;  // u16 per (block64, row, class)
  static constexpr int kSmemBytes =
      2 * kKvBytes + 4 * kQBytes + kDsBytes + 2 * (2 * kScalarBytes + kKeepBytes);
};

// Tile shapes per head-dim bucket (keys per CTA, queries per step, CTAs per SM):
//   64:  64 keys (4 warps), 64 queries, 2 CTAs per SM (255 registers, no spills). H200, bf16,
//        2026-12-03, against the previous 128 keys x 32 queries (128 registers, 48 bytes spilled)
//        in one run: backward 6.7% faster on bert-base 32x12x512, 5.2% on 4x32x4096 causal,
//        0.7% on 8x16x2048, 30% on 2x8x1024 causal (twice the CTAs). 128 keys x 64 queries x 1
//        CTA: 2.5% faster than this shape on 8x16x2048, up to 2% slower on the other three.
//   128: 128 keys (8 warps), 64 queries, ~157 KB smem, 1 CTA per SM
//   256: 64 keys (4 warps), 16 queries; correct, not tuned (dK/dV accumulators of 256 floats
//        per thread spill: 828 bytes; 32 queries spilled 1632)
template <int kHeadDim>
struct BwdConfig;
template <>
struct BwdConfig<64> {
  using Traits = BwdTraits<64, 64, 64, 2>;
};
template <>
struct BwdConfig<128> {
  using Traits = BwdTraits<128, 128, 64, 1>;
};
template <>
struct BwdConfig<256> {
  using Traits = BwdTraits<256, 64, 16, 1>;
};
// The fewest keys per CTA of any bucket (the bound on a packed call's key tiles).
inline constexpr int kBackwardMinBlockN =
    std::min({BwdConfig<64>::Traits::kBlockN, BwdConfig<128>::Traits::kBlockN,
              BwdConfig<256>::Traits::kBlockN});

// The fp32 rows of softmax_d and dq_accum, [batches][Hq][rows] contiguous. Dense: one per
// (b, h, i). Packed: one per (h, packed query row) in a single batch (q's b stride is 0), so a
// sequence's rows sit at its packed rows: no per-sequence padding, since the kernels never touch
// a row at or past a sequence's length, and rows of no sequence stay 0 (dq = 0 there).
struct WorkspaceRows {
  std::int64_t batches = 0, rows = 0;  // rows per (batch, head)
};
MEMEFF_HD WorkspaceRows workspace_rows(const ForwardParams& p) {
  return packed_layout(p) ? WorkspaceRows{1, p.total_q} : WorkspaceRows{p.B, p.Lq};
}

// Byte offsets of the backward workspace's pieces (each 16-byte aligned) and its dbias plan.
struct BackwardWorkspace {
  std::size_t softmax_d = 0, dq_accum = 0, dbias_accum = 0, total = 0;
  DbiasPlan dbias;
};

inline BackwardWorkspace backward_workspace_layout(const BackwardParams& p) {
  auto align16 = [](std::size_t n) { return (n + 15) / 16 * 16; };
  BackwardWorkspace ws;
  const WorkspaceRows wr = workspace_rows(p);
  const std::size_t rows = static_cast<std::size_t>(wr.batches) * p.Hq * wr.rows;
  ws.softmax_d = 0;
  ws.dq_accum = align16(rows * sizeof(float));
  ws.dbias_accum = ws.dq_accum + align16(rows * static_cast<std::size_t>(p.D) * sizeof(float));
  ws.dbias = dbias_plan(p);
  ws.total =
      ws.dbias_accum + align16(static_cast<std::size_t>(ws.dbias.reserved_elems) * sizeof(float));
  return ws;
}

}  // namespace memeff::cuda::sm80
