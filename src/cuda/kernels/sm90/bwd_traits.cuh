// Tile shapes, shared-memory plan and the kernel parameter of the sm90 backward
// (src/cuda/kernels/sm90/bwd_kernel.cuh): what the host launcher needs to size TMA boxes, shared
// memory, the workspace and the grid, without the kernel.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/reasons.h"
#include "cuda/kernels/common/varlen.cuh"

namespace memeff::cuda::sm90 {

// The kernel's one parameter: TMA descriptors of q and dout (dims D, L, H, B innermost first;
// boxes of 64 columns by kBlockM rows, 128-byte swizzle), the plain backward params and the
// workspace the preprocessing kernel filled.
struct BackwardTmaParams {
  CUtensorMap q, dout;
  BackwardParams p;
  // [B·Hq][lq_pad] each: lse·log2(e) (+inf for rows without a visible key and for the padding,
  // so their probabilities are 0) and rowsum(dO ∘ O) (0 in the padding). p.softmax_d is delta.
  float* lse_log2 = nullptr;
  // [B·Hq][m_blocks][2][64·64] fp32 partial sums of dQ in the order the consumer warpgroups
  // hold them (see bwd_convert_dq_kernel), reduced into by every key block; p.dq_accum points
  // here. dbias accumulator [dB, dH, dL, Lk] when dbias is reduced over broadcast dimensions.
  // Packed calls: [Hq][m_blocks] blocks (B = 1 in the layouts above and below), sequence s's
  // query blocks starting at block packed_block0(s) (see backward_workspace_layout).
  float* dbias_accum = nullptr;
  DbiasMode dbias_mode = DbiasMode::none;  // reduced: fp32 atomics into dbias_accum
  // Deterministic mode: [B·Hq][m_blocks][2] turn counters; key block n adds its dQ partial to
  // a chunk when the chunk's counter reads n.
  int* dq_turn = nullptr;
  std::int64_t lq_pad = 0;  // m_blocks · kBlockM
  int m_blocks = 0;         // query blocks per (batch,) head in the workspace
  // Dense grids (band, key blocks, B·Hkv / band) (common/block_order.h): CTA (x, y, z) takes key
  // block y of (batch, kv head) z·band + x. Added to those: key_block_base and head_base
  // (launches of one CTA each, for a deterministic dbias).
  int key_block_base = 0, head_base = 0;
  // Each CTA's steps from the last query block, the group's heads inside each (BackwardWalk,
  // common/block_order.h): the deterministic mode under a right bound.
  bool walk_from_last = false;
  // A persistent grid (the kernels of backward_persists, dense calls without a causal mask):
  // persist_tiles tiles, tile t being key block t % persist_key_blocks of (batch, kv head)
  // t / persist_key_blocks, CTA x taking tiles x, x + gridDim.x, ...; 0: one tile per CTA.
  int persist_tiles = 0, persist_key_blocks = 0;
  // Packed calls: the query tiles per head of the preprocess and dq conversion grids (the tile
  // scheduler's bound over cu_seqlens_q); the main kernel's grid is (key tiles, Hkv).
  int packed_q_tiles = 0;
  // A 16-bit bias that varies over queries, as dims (Lk, Lq, H|1, B|1) with boxes of 64 keys by
  // 64 queries; bias_tiles says the launcher could describe it (else the kernel reads the bias
  // per score from global memory through BiasColumns).
  CUtensorMap bias;
  bool bias_tiles = false;
};

// One instantiation: kHeadDim is the head-dim bucket (D and Dv zero-padded up to it), kBlockM the
// queries per step. Each CTA owns kBlockN = 128 keys of one (batch, kv head): the consumer
// warpgroups own 64 keys each (their rows of Sᵀ = K·Qᵀ and of dK, dV), and split dQ = dS·K of a
// query block between them: by query rows when kBlockM = 128, by head-dim columns when
// kBlockM = 64, so each computes a 64 x 64 block of dQ. kStages_: the depth of the Q/dO ring (2
// where the bias tiles ride with it: bwd_kernel.cuh).
template <int kHeadDim_, int kBlockM_, int kStages_>
struct BwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = 128;
  static constexpr int kConsumers = 2;
  static constexpr int kStages = kStages_;  // Q/dO ring depth
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kDBlocks = kHeadDim / 64;        // 64-column (128-byte) smem blocks
  static constexpr int kNT = kBlockM / 8;               // n8 tiles of Sᵀ per row (queries)
  static constexpr int kDT = kHeadDim / 8;              // n8 tiles of dK, dV per row (head dim)
  static constexpr int kSdPSteps = kHeadDim / 16;       // k16 steps of Sᵀ and dPᵀ (head dim)
  static constexpr int kKVSteps = kBlockM / 16;         // k16 steps of dV and dK (queries)
  static constexpr int kDqSteps = kBlockN / 16;         // k16 steps of dQ (keys)
  static constexpr bool kDqSplitRows = kBlockM == 128;  // else split by head-dim columns
  static constexpr int kDqFloats = 64 * 64;             // one warpgroup's dQ block (workspace)
  // Shared memory (bytes), each buffer 1024-byte aligned for the 128-byte swizzle:
  static constexpr int kQBlockBytes = kBlockM * 128;  // 64 columns of a Q or dO tile
  static constexpr int kKVBlockBytes = kBlockN * 128;
  static constexpr int kQBytes = kDBlocks * kQBlockBytes;    // one Q (or dO) stage
  static constexpr int kKVBytes = kDBlocks * kKVBlockBytes;  // K (or V)
  static constexpr int kDsBytes = kBlockM * kBlockN * 2;     // dS [query/64][key][64 queries]
  static constexpr int kStatBytes = kBlockM * 4;             // lse or delta of one step
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKVBytes;
  static constexpr int kOffQ = kOffV + kKVBytes;             // kStages buffers
  static constexpr int kOffDo = kOffQ + kStages * kQBytes;   // kStages buffers
  static constexpr int kOffDs = kOffDo + kStages * kQBytes;  // 2 buffers
  // Per consumer, two buffers (steps) of lse·log2(e) and delta.
  static constexpr int kOffStats = kOffDs + 2 * kDsBytes;
  static constexpr int kOffBar = kOffStats + kConsumers * 2 * 2 * kStatBytes;
  // Per stage: full, empty, and per consumer "dQ staged" (the deterministic mode's writer).
  static constexpr int kBarriers = (2 + kConsumers) * kStages;
  // The deterministic mode's dQ slots: per stage and consumer, the workspace chunk and the turn
  // of the dQ staged there (DqSlot in bwd_dq.cuh, 16 bytes).
  static constexpr int kOffSlots = kOffBar + 8 * kBarriers;
  static constexpr int kSmemBytes = 1024 + kOffSlots + 16 * kStages * kConsumers;
  // After the main loop the Q, dO and dS buffers hold dK and dV (kHeadDim columns, 16-byte
  // chunks swizzled by row) on their way to global memory.
  static constexpr int kOutBytes = kBlockN * kHeadDim * 2;
  // Register split (setmaxnreg), as in the forward: 24 for the producer, 240 for the consumers.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  // Named barrier ids: 0 is __syncthreads; 1 both consumer warpgroups (dS complete, K/V loaded,
  // the deterministic mode's dO and dS read before dQ is staged there); 4 + w warpgroup w's
  // lse/delta buffers; 6 + w its bias tile read (before its dS overwrites it).
  static constexpr int kConsumerBarrier = 1;
  static constexpr int kStatBarrier = 4;
  static constexpr int kBiasBarrier = 6;
  static_assert(kHeadDim == 64 || kHeadDim == 128,
                "head-dim buckets 64 and 128 (256: BwdWideTraits)");
  static_assert(kBlockM * kHeadDim == 2 * 64 * 64, "each consumer computes a 64 x 64 dQ block");
  static_assert(kQBytes >= kDqFloats * 4 && kDsBytes >= kDqFloats * 4,
                "the deterministic mode stages a warpgroup's dQ in a dO stage or a dS buffer");
  static_assert(2 * kOutBytes <= kOffStats - kOffQ, "dK and dV staging fits the Q/dO/dS buffers");
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (kConsumers + 1) * kLaunchRegs,
                "setmaxnreg split exceeds the registers allocated at launch");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");
  static_assert(2 * kStatBytes / 16 % 32 == 0 && 2 * kStatBytes / 16 <= 96,
                "lse/delta copies fill whole warps 1..3 of a consumer warpgroup");
};

// Tile shapes per head-dim bucket (the FlashAttention-3 shapes for these head dims):
//   64:  128 queries per step: Sᵀ and dPᵀ are 64 x 128 per warpgroup, dQ split by rows
//   128:  64 queries per step: Sᵀ and dPᵀ are 64 x 64, dQ split by columns
// with a Q/dO ring three steps deep (measured on the H100 beside two, without dropout: +6.9% at
// long-16k causal, +4.4% GQA causal, within 1% elsewhere), two in the kernels of bias tiles
// (BiasTileTraits), whose boxes share the dS buffers.
template <int kHeadDim>
struct BwdConfig;
template <>
struct BwdConfig<64> {
  using Traits = BwdTraits<64, 128, 3>;
  using BiasTileTraits = BwdTraits<64, 128, 2>;
};
template <>
struct BwdConfig<128> {
  using Traits = BwdTraits<128, 64, 3>;
  using BiasTileTraits = BwdTraits<128, 64, 2>;
};

// The wide tile, head dims 129-256 (bucket 256; bwd_wide_kernel.cuh): 64 keys per CTA, 64 queries
// per step. dK and dV of 64 keys by 256 columns take 256 fp32 registers a thread in one
// warpgroup, so the two consumer warpgroups split them by head-dim halves (128 columns each) and
// split Sᵀ and dPᵀ by query halves (64 keys x 32 queries each); Pᵀ∘Z and dSᵀ meet in shared
// memory, where the dV, dK and dQ products read them as their A operands. dQ (64 queries x 256)
// goes to the fp32 workspace by vector atomics straight from the accumulators (no staging
// buffer: shared memory holds K, V, two Q/dO stages and two Pᵀ/dSᵀ buffers, 226 KiB).
struct BwdWideTraits {
  static constexpr int kHeadDim = 256;
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = 64;
  static constexpr int kConsumers = 2;
  static constexpr int kStages = 2;  // Q/dO/lse/delta ring depth
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kDBlocks = kHeadDim / 64;  // 64-column (128-byte) smem blocks
  static constexpr int kHalfQueries = kBlockM / 2;  // a warpgroup's queries of Sᵀ and dPᵀ
  static constexpr int kNT = kHalfQueries / 8;      // n8 tiles of a warpgroup's Sᵀ row
  static constexpr int kHalfDT = kHeadDim / 2 / 8;  // n8 tiles of a warpgroup's dK, dV, dQ
  static constexpr int kSdPSteps = kHeadDim / 16;   // k16 steps of Sᵀ and dPᵀ (head dim)
  static constexpr int kKVSteps = kBlockM / 16;     // k16 steps of dV and dK (queries)
  static constexpr int kDqSteps = kBlockN / 16;     // k16 steps of dQ (keys)
  static constexpr int kDqChunks = kBlockM * kHeadDim / (64 * 64);  // 64 x 64 workspace chunks
  // Shared memory (bytes), each buffer 1024-byte aligned for the 128-byte swizzle:
  static constexpr int kQBlockBytes = kBlockM * 128;  // 64 columns of a Q or dO tile
  static constexpr int kKVBlockBytes = kBlockN * 128;
  static constexpr int kQBytes = kDBlocks * kQBlockBytes;    // one Q (or dO) stage
  static constexpr int kKVBytes = kDBlocks * kKVBlockBytes;  // K (or V)
  static constexpr int kPBytes = kBlockN * kBlockM * 2;      // Pᵀ or dSᵀ [key row][64 queries]
  static constexpr int kStatBytes = kHalfQueries * 4;        // a warpgroup's lse or delta
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKVBytes;
  static constexpr int kOffQ = kOffV + kKVBytes;             // kStages buffers
  static constexpr int kOffDo = kOffQ + kStages * kQBytes;   // kStages buffers
  static constexpr int kOffP = kOffDo + kStages * kQBytes;   // 2 buffers (steps)
  static constexpr int kOffDs = kOffP + 2 * kPBytes;         // 2 buffers (steps)
  // Per consumer, two buffers (steps) of lse·log2(e) and delta.
  static constexpr int kOffStats = kOffDs + 2 * kPBytes;
  static constexpr int kOffBar = kOffStats + kConsumers * 2 * 2 * kStatBytes;
  static constexpr int kBarriers = 2 * kStages;  // full / empty per stage
  static constexpr int kSmemBytes = 1024 + kOffBar + 8 * kBarriers;
  // After the main loop the Q buffers hold dK and dV (kHeadDim columns, 16-byte chunks swizzled
  // by row) on their way to global memory.
  static constexpr int kOutBytes = kBlockN * kHeadDim * 2;
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  // Named barrier ids: 0 is __syncthreads; 1 both consumer warpgroups (Pᵀ and dSᵀ complete, K/V
  // loaded); 2 + w warpgroup w's deterministic dQ turn; 4 + w its lse/delta buffers.
  static constexpr int kConsumerBarrier = 1;
  static constexpr int kDqBarrier = 2;
  static constexpr int kStatBarrier = 4;
  static_assert(kBlockN == 64, "one 64-key block of the dropout map per CTA, in K's row order");
  static_assert(kNT == 4, "the keep-bit exchange of the wide tile is for 32 queries a warpgroup");
  static_assert(2 * kOutBytes <= kStages * kQBytes, "dK and dV staging fits the Q buffers");
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (kConsumers + 1) * kLaunchRegs,
                "setmaxnreg split exceeds the registers allocated at launch");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");
  static_assert(2 * kStatBytes / 16 <= 32, "lse/delta copies fill part of warp 1");
};

using BackwardHeadDims = HeadDims<64, 128, 256>;

constexpr int backward_block_m(int bucket) {
  return bucket == 64    ? BwdConfig<64>::Traits::kBlockM
         : bucket == 128 ? BwdConfig<128>::Traits::kBlockM
         : bucket == 256 ? BwdWideTraits::kBlockM
                         : 0;
}
// The keys per CTA (a dense grid's key blocks): 128, or 64 for the wide tile.
constexpr int backward_block_n(int bucket) {
  return bucket == 256 ? BwdWideTraits::kBlockN : 128;
}
inline constexpr int kBackwardBlockN = 128;
// The fewest queries per step of any bucket (the bound on a packed call's query tiles).
inline constexpr int kBackwardMinBlockM =
    std::min(BwdConfig<64>::Traits::kBlockM, BwdConfig<128>::Traits::kBlockM);

// The first workspace block of packed sequence s whose first query row is q0 (clamped, as
// seq_span gives it): (q0 + s·block_m) / block_m. Each sequence gets its own whole blocks (the
// fragment-order dQ chunks and bulk reductions stay block-aligned) and they never overlap: block
// b(s) + ceil(Lq_s / block_m) - 1 < b(s + 1) since q0(s + 1) >= q0(s) + Lq_s; the last one used is
// below total_q / block_m + S (q0 + Lq_s <= total_q after clamping, even for unchecked offsets).
constexpr std::int64_t packed_block0(std::int64_t q0, int s, int block_m) {
  return (q0 + static_cast<std::int64_t>(s) * block_m) / block_m;
}

// Byte offsets of the workspace pieces (each 256-byte aligned) and its dbias plan.
struct BackwardWorkspace {
  std::size_t lse_log2 = 0, delta = 0, dq_accum = 0, dbias_accum = 0, dq_turn = 0, total = 0;
  std::int64_t lq_pad = 0, dq_accum_floats = 0, dq_turns = 0;
  int m_blocks = 0;
  DbiasPlan dbias;
};

// Packed calls (packed_layout): the padded per-sequence layout (per head, total_q / block_m + S
// blocks: packed_block0); dense: per (batch, head) ceil(Lq / block_m) blocks.
inline BackwardWorkspace backward_workspace_layout(const BackwardParams& p, int bucket) {
  auto align = [](std::size_t n) { return (n + 255) / 256 * 256; };
  const bool packed = packed_layout(p);
  BackwardWorkspace ws;
  const int block_m = backward_block_m(bucket);
  if (block_m == 0) return ws;
  const std::int64_t heads = packed ? p.Hq : static_cast<std::int64_t>(p.B) * p.Hq;
  ws.m_blocks =
      static_cast<int>(packed ? p.total_q / block_m + p.B : (p.Lq + block_m - 1) / block_m);
  ws.lq_pad = static_cast<std::int64_t>(ws.m_blocks) * block_m;
  ws.dq_accum_floats = heads * ws.lq_pad * bucket;
  ws.dq_turns = heads * ws.m_blocks * 2;
  ws.lse_log2 = 0;
  ws.delta = align(static_cast<std::size_t>(heads * ws.lq_pad) * 4);
  ws.dq_accum = ws.delta + align(static_cast<std::size_t>(heads * ws.lq_pad) * 4);
  ws.dq_turn = ws.dq_accum + align(static_cast<std::size_t>(ws.dq_accum_floats) * 4);
  ws.dbias_accum = ws.dq_turn + align(static_cast<std::size_t>(ws.dq_turns) * 4);
  ws.dbias = dbias_plan(p);
  ws.total = ws.dbias_accum + align(static_cast<std::size_t>(ws.dbias.reserved_elems) * 4);
  return ws;
}

}  // namespace memeff::cuda::sm90
