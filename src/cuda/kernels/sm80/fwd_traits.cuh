// Tile shapes of the sm80 forward (fwd_kernel.cuh): the traits of one instantiation and the
// shape chosen per head-dim bucket, what the launcher needs to size shared memory and the grid.
#pragma once

#include "cuda/kernels/common/reasons.h"

namespace memeff::cuda::sm80 {

// Head-dim buckets with a compiled kernel; D and Dv up to the bucket are zero-padded in smem.
using ForwardHeadDims = HeadDims<64, 128, 256>;

// Tile shape of one instantiation. kHeadDim bounds both D and Dv (zero-filled beyond them).
template <int kHeadDim_, int kBlockM_, int kWarps_, int kMinBlocks_>
struct FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = 64;  // = the dropout map's column block: one Philox call per row
  static constexpr int kWarps = kWarps_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // m16 tiles per warp
  static constexpr int kNTiles = kBlockN / 8;        // n8 tiles of S per row
  static constexpr int kDTiles = kHeadDim / 8;       // n8 tiles of O per row
  static constexpr int kKSteps = kHeadDim / 16;      // k16 steps of Q·Kᵀ
  static constexpr int kChunks = kHeadDim / 8;       // 16-byte chunks per smem row
  // Q fragments stay in registers when they are few (hd64); otherwise they are re-read from
  // shared memory each tile (as FlashAttention-2 does), which keeps O and S in registers.
  static constexpr bool kQInRegs = kMTiles * kKSteps * 4 <= 32;
  static constexpr int kSmemQ = kBlockM * kHeadDim;  // elements
  static constexpr int kSmemKV = kBlockN * kHeadDim;
  static constexpr int kSmemBytes = (kSmemQ + 4 * kSmemKV) * 2;  // Q + 2 K + 2 V buffers
  static_assert(kRowsPerWarp % 16 == 0 && kChunks >= 8 && kDTiles % 2 == 0);
  static_assert((kBlockM * kChunks) % kThreads == 0 && (kBlockN * kChunks) % kThreads == 0);
};

// Tile shapes per head-dim bucket (FlashAttention-2's choices for mma.sync):
//   64:  128 rows, 4 warps (32 rows each, Q in registers), 48 KB smem
//   128: 128 rows, 4 warps (32 rows each, Q from smem), 96 KB smem, 2 blocks per SM
//   256: 128 rows, 8 warps (16 rows each, Q from smem), 192 KB smem, 1 block per SM
// Measured on the H200 (bf16, anchor shapes, 2026-12-02): for hd64 and hd128, 8 warps x 16 rows
// was 25-35% slower (each warp re-reads all of K and V from smem) and 64-row blocks 10-25% slower.
inline constexpr int kForwardBlockM = 128;  // every bucket's query rows per CTA
template <int kHeadDim>
struct FwdConfig;
template <>
struct FwdConfig<64> {
  using Traits = FwdTraits<64, kForwardBlockM, 4, 2>;
};
template <>
struct FwdConfig<128> {
  using Traits = FwdTraits<128, kForwardBlockM, 4, 2>;
};
template <>
struct FwdConfig<256> {
  using Traits = FwdTraits<256, kForwardBlockM, 8, 1>;
};

}  // namespace memeff::cuda::sm80
