// Tile shapes and the kernel parameter of the sm90 forward (src/cuda/kernels/sm90/fwd_kernel.cuh):
// what the host launcher needs to size TMA boxes, shared memory and the grid, without the kernel.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/reasons.h"

namespace memeff::cuda::sm90 {

// The kernel's one parameter: TMA descriptors of q, k, v (dims D, L, H, B innermost first; boxes
// of 64 columns by kBlockM or kBlockN rows, 128-byte swizzle) and the plain forward params.
struct ForwardTmaParams {
  CUtensorMap q, k, v;
  ForwardParams p;
  // Packed calls (p.cu_seqlens_q set): the query tiles per head the grid covers, from
  // varlen_tile_bound (src/cuda/kernels/common/varlen.cuh); CTA x takes head x / packed_tiles and
  // tile x % packed_tiles. The maps then describe the packed tensors as [1, H, total, D].
  int packed_tiles = 0;
  // A 16-bit bias that varies over queries, as dims (Lk, Lq, H|1, B|1) with boxes of 64 keys by
  // kBlockM rows; bias_tiles says the launcher could describe it (else the kernel reads the bias
  // per score from global memory).
  CUtensorMap bias;
  bool bias_tiles = false;
  // Dense calls: work item `index` is (batch·head, query block) in the order of
  // common/block_order.h over B·Hq heads of m_blocks query blocks (the last query block first),
  // in bands of head_band heads (1: head by head; head_band divides B·Hq).
  int head_band = 1;
  // Dense calls whose items differ in cost (a causal mask, a one-sided window) on a persistent
  // grid: a counter the launcher zeroed, from which each CTA takes the item after its first
  // (item gridDim.x + the counter's old value), so whichever CTA finishes first takes the next
  // item in the walk's order; and per CTA, kMaxQStages slots in which its producer tells its
  // consumers the item each Q buffer holds (fwd_scheduler.cuh). Null: CTA x walks items x,
  // x + gridDim.x, ... and every role counts them itself. Both live in the workspace
  // (kForwardWalkBytes: Family::forward_workspace_bytes).
  int* item_counter = nullptr;
  int* item_slots = nullptr;
};

// The dynamic walk's workspace: the counter (16 bytes, zeroed before each launch) and the slots of
// at most kMaxWalkCtas CTAs (a grid of more SMs walks statically).
inline constexpr int kMaxQStages = 2, kMaxWalkCtas = 1024;
inline constexpr int kForwardWalkBytes = 16 + 4 * kMaxQStages * kMaxWalkCtas;

// How a forward instantiation reads the bias (attention_forward_kernel's kBiasRead).
enum class BiasRead {
  none,    // no bias
  global,  // each score's entry from global memory (fp32 biases, strides TMA cannot describe)
  keys,    // broadcast over queries (a key-padding mask): each key tile's entries staged in
           // shared memory by the consumers, one tile ahead
  tiles,   // a 16-bit bias that varies over queries: [kBlockM x kBlockN] tiles loaded by TMA
           // beside K and V into a ring of kStages shared-memory buffers
};

// Tile shape of one instantiation. kHeadDim bounds D and Dv (zero-filled beyond them by TMA).
template <int kHeadDim_, int kBlockN_, int kConsumers_, int kStages_, int kQStages_ = 1>
struct FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN =
      kBlockN_;  // keys per tile (a multiple of the 64-key dropout block)
  static constexpr int kConsumers = kConsumers_;  // consumer warpgroups, 64 query rows each
  static constexpr int kStages = kStages_;        // K/V shared-memory ring depth
  // Q buffers: with two, the producer loads the next work item's Q while the consumers still run
  // the current one (a persistent CTA's items then start without waiting for their Q).
  static constexpr int kQStages = kQStages_;
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kDBlocks = (kHeadDim + 63) / 64;  // 64-column (128-byte) smem blocks
  static constexpr int kNT = kBlockN / 8;                // n8 tiles of S per row
  static constexpr int kDT = kHeadDim / 8;               // n8 tiles of O per row
  static constexpr int kQKSteps = kHeadDim / 16;         // k16 steps of Q·Kᵀ
  static constexpr int kPVSteps = kBlockN / 16;          // k16 steps of P·V
  static constexpr int kQBlockBytes = kBlockM * 128;
  static constexpr int kKVBlockBytes = kBlockN * 128;
  static constexpr int kQBytes = kDBlocks * kQBlockBytes;
  static constexpr int kKVBytes = kDBlocks * kKVBlockBytes;  // one K or V stage
  // A key-padding bias's entries of a key tile, fp32, double-buffered per consumer warpgroup.
  static constexpr int kKeyBiasBytes = 2 * kConsumers * kBlockN * 4;
  // A 16-bit bias tile of one stage: boxes of 64 keys (128 bytes, swizzled as Q) by kBlockM rows.
  static constexpr int kBiasBoxBytes = kBlockM * 128;
  static constexpr int kBiasTileBytes = kBlockN / 64 * kBiasBoxBytes;
  // Q full/empty per Q buffer; K full/empty; V full/empty; bias tiles full/empty (used by
  // BiasRead::tiles).
  static constexpr int kBarriers = 2 * kQStages + 6 * kStages;
  // Shared memory of the kernel that reads the bias as kRead says: the Q buffers, the K/V ring,
  // the bias ring (tiles), the barriers, the staged key entries (keys); + 1024 so the buffers
  // can be aligned to the 128-byte swizzle's 1024-byte period.
  template <BiasRead kRead>
  static constexpr int smem_bytes() {
    return 1024 + kQStages * kQBytes + 2 * kStages * kKVBytes +
           (kRead == BiasRead::tiles ? kStages * kBiasTileBytes : 0) + 8 * kBarriers +
           (kRead == BiasRead::keys ? kKeyBiasBytes : 0);
  }
  // Register split (setmaxnreg): the producer gives registers back and the consumers take them.
  // setmaxnreg.inc waits until the CTA's pool (what the launch allocated: kLaunchRegs per thread)
  // can serve it, so the split must fit in that pool or the consumers wait forever.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
  // Named barrier ids: 0 is __syncthreads; then one per consumer for the ping-pong turn, then
  // one per consumer for its staged key-bias tiles.
  static constexpr int kTurnBarrier = 1;
  static constexpr int kKeyBiasBarrier = kTurnBarrier + kConsumers;
  static_assert(kBlockN % 64 == 0 && kBlockN <= 256, "key tiles hold whole 64-key dropout blocks");
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "head dim bucket: multiple of 16 up to 256");
  static_assert(kConsumers >= 1 && kConsumers <= 3, "1 to 3 consumer warpgroups");
  static_assert(kQStages >= 1 && kQStages <= kMaxQStages, "one or two Q buffers");
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (kConsumers + 1) * kLaunchRegs,
                "setmaxnreg split exceeds the registers allocated at launch");
  static_assert(smem_bytes<BiasRead::tiles>() <= 227 * 1024 &&
                    smem_bytes<BiasRead::keys>() <= 227 * 1024,
                "shared memory per CTA");
};

// Tile shapes per head-dim bucket: kBlockM = 64 per consumer warpgroup, kBlockN keys per tile,
// stages of the K/V ring (docs/benchmarks.md has the measurements behind them).
//   64:  2 consumers (128 rows), 128 keys, 2 stages:  2 x 16 KB Q + 64 KB K/V
//        or, where forward_takes_wide_tile (no dropout), 3 consumers (192 rows): 2 x 24 KB Q
//   96:  2 consumers (128 rows), 128 keys, 2 stages:  32 KB Q + 128 KB K/V (padded to 128)
//   128: 2 consumers (128 rows), 128 keys, 2 stages:  32 KB Q + 128 KB K/V
//   256: 2 consumers (128 rows),  64 keys, 2 stages:  64 KB Q + 128 KB K/V
// A 16-bit bias that varies over queries (BiasRead::tiles) adds a ring of 128-row bias tiles,
// one per stage: 2 x 32 KB (head dims 64-128), 2 x 16 KB (256); every bucket stays within 227 KB.
// The second Q buffer made head dim 64's forward 4-5% faster on the encoder shapes (197-512
// queries: an item there is 2-4 key tiles, and its Q no longer waits for the last one's) and
// 1-2% on longer ones; at head dim 128 it gained 1% without dropout and lost 2% with it (H100,
// docs/benchmarks.md), so 96 and 128 keep one.
template <int kHeadDim>
struct FwdConfig;
template <>
struct FwdConfig<64> {
  using Traits = FwdTraits<64, 128, 2, 2, 2>;
  // Three consumers (192-row items; FlashAttention-3's head-dim-64 tile) for the plain kernel
  // without dropout, where forward_takes_wide_tile says.
  using WideTraits = FwdTraits<64, 128, 3, 2, 2>;
};
template <>
struct FwdConfig<96> {
  using Traits = FwdTraits<96, 128, 2, 2>;
  using WideTraits = void;
};
template <>
struct FwdConfig<128> {
  using Traits = FwdTraits<128, 128, 2, 2>;
  using WideTraits = void;
};
template <>
struct FwdConfig<256> {
  using Traits = FwdTraits<256, 64, 2, 2>;
  using WideTraits = void;
};

// Whether a call of head-dim bucket `bucket` takes its bucket's WideTraits: head dim 64 without
// dropout, a bias, score modifiers or packing, where 192-row items cover Lq with at most 1/8
// more rows than 128-row ones and, under a causal mask, Lq >= 2048. Measured beside two
// consumers (H100, docs/benchmarks.md, twenty-second and twenty-third sessions), without dropout
// where this rule takes it: 0.86-0.90 of the time on 32,16,384,64, 8,16,2048,64 and the causal
// 4,32,4096,64 and 2,16,8192,64, 0.94-0.96 on 16,16,1024,64 and bert-base 32,12,512,64; where it
// does not: 5.6% slower on the Llama step's 8,16/4kv,1024,64 causal, and with dropout up to
// 18.8% slower.
inline bool forward_takes_wide_tile(const ForwardParams& p, int bucket) {
  if (bucket != 64 || p.has_dropout || p.bias != nullptr || p.mods.flags != 0 ||
      p.cu_seqlens_q != nullptr) {
    return false;
  }
  const std::int64_t wide_rows = (p.Lq + 191) / 192 * 192, rows = (p.Lq + 127) / 128 * 128;
  return 8 * wide_rows <= 9 * rows && (p.causal == Causal::none || p.Lq >= 2048);
}

// Head-dim buckets with a compiled kernel; D and Dv up to the bucket are zero-padded by TMA.
using ForwardHeadDims = HeadDims<64, 96, 128, 256>;

// Rows of the Q box (the CTA's query block) and of the K/V boxes (the key tile) of a bucket.
struct ForwardTile {
  int block_m = 0, block_n = 0;
};
template <class Tr>
constexpr ForwardTile tile_of() {
  return {Tr::kBlockM, Tr::kBlockN};
}
// `wide`: forward_takes_wide_tile's answer for the call.
constexpr ForwardTile forward_tile(int bucket, bool wide = false) {
  return bucket == 64    ? (wide ? tile_of<FwdConfig<64>::WideTraits>()
                                 : tile_of<FwdConfig<64>::Traits>())
         : bucket == 96  ? tile_of<FwdConfig<96>::Traits>()
         : bucket == 128 ? tile_of<FwdConfig<128>::Traits>()
         : bucket == 256 ? tile_of<FwdConfig<256>::Traits>()
                         : ForwardTile{};
}

}  // namespace memeff::cuda::sm90
