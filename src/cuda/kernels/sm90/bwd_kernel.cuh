// The sm90 (Hopper, sm_90a) fused attention backward: warp-specialized, TMA-fed, wgmma-based.
//
// One CTA per key block of kBlockN = 128 keys and (batch, kv head); it walks the query blocks
// (and, with GQA, the query heads of its kv head) that see any of its keys. Warpgroup 0 is the
// producer: one thread issues the TMA loads of each step's Q and dO tiles and the 1-d bulk
// into a kStages-deep ring; the consumers copy the step's lse·log2(e) and delta = rowsum(dO ∘ O)
// themselves. Warpgroups 1 and 2 are consumers, each owning 64 keys: after loading K and V once,
// per step they compute
//   Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ  (wgmma, both operands in shared memory),
//   Pᵀ = exp2(Sᵀ·scale·log2 e − lse·log2 e), dSᵀ = Pᵀ ∘ (Z ∘ dPᵀ − delta)   (registers),
//   dV += (Pᵀ ∘ Z)·dO  (wgmma with Pᵀ from registers),
// write dSᵀ to shared memory and, once both warpgroups have, dQ = dS·K for their 64 x 64 half of
// the step's dQ (wgmma, dS read M-major), then dK += dSᵀ·Q (dSᵀ from registers). dQ goes into
// the fp32 workspace by 16-byte reductions straight from the accumulators, issued while the
// tensor cores run dK. dK and dV stay in registers until the end and are written once (summed
// over the query heads of a GQA group).
//
// The deterministic mode (bitwise-repeatable dQ): the key blocks add into a dQ chunk one after
// another in key-block order, each waiting for its turn on the chunk's counter. The consumers do
// not wait: once both warpgroups' dV and dQ products are done, each stages its 64 x 64 fp32 dQ
// in shared memory (warpgroup 0 in the step's dO buffer, 1 in its dS buffer; both dead by then)
// and goes on. Two of the producer warpgroup's idle warps are the writers: writer w waits for
// consumer w's staged dQ, then for the chunk's turn, adds it with one bulk reduction, frees the
// Q/dO stage once the reduction has read it (the stage's empty barrier counts every consumer
// thread and the writers) and passes the turn on once its writes are performed. Under a right
// bound (causal, a window's right side) each CTA walks its query blocks from the last
// (BackwardWalk, common/block_order.h), so the turns of a query block come in the order the CTAs
// reach it.
//
// Dropout in the Sᵀ orientation, from the documented map (docs/dropout.md) so the mask is the
// forward's and the reference's bit for bit. The rows of K and V are loaded permuted inside each
// 64-key block: warp w's rows hold the keys 8g + 2w + {0, 1} (g = 0..7), the 16 keys of column
// class w. Then, per query, the 16 bytes of the one Philox call of (query, 64-key block, class w)
// belong to the eight lanes of one lane column (lane g has bytes 2g, 2g + 1): each lane computes
// one call per 16 of its elements and the eight lanes trade their 2-bit shares with an 8 x 8
// transpose of nibbles (three shuffles per 64 queries). Nothing else sees the permutation: dS
// rows in shared memory follow K's rows, so dQ = dS·K sums the same keys, and dK, dV are
// written through shared memory to their true rows.
//
// Bias: a 16-bit bias that varies over queries (kBiasTiles) is loaded by the producer with each
// step's Q and dO, into the dS buffer that step will write (free by then: the same empty barrier
// that frees the Q/dO stage follows the last dQ product reading it); each warpgroup reads its
// 64 keys' entries from there and passes a barrier before its dS overwrites them. Any other bias
// is read per score from global memory (BiasColumns; a key-padding bias once per block).
//
// Sliding window, ALiBi and softcap (ScoreMods in params.h, docs/window.md): a key block walks
// only the query blocks that see one of its keys (KeyMask::query_blocks), so its work follows the
// window; steps the window cuts get its element mask, and rows that see a single key (by the
// window's count) dS = 0. The deterministic mode adds a key block's dQ at its place among the key
// blocks that reach the query block, counted from the first the window lets in. The window is in
// the packed instantiations and those of bias tiles; dense calls without a bias or with a
// per-score one take the modifiers' kernels for it, as for ALiBi and the cap (whose derivative
// 1 - tanh² multiplies dS after dbias took it; kMods below).
//
// Packed sequences (kPacked, params.h: cu_seqlens_q/k): the grid is (key tiles, Hkv) and CTA x
// takes the key block of the varlen tile scheduler over cu_seqlens_k
// (src/cuda/kernels/common/varlen.cuh), so a sequence gets one CTA per 128 of its keys (one with
// none, for dk = dv = 0, when it has no queries) and CTAs past the last tile exit. Everything else
// is the sequence's: its query blocks (Q and dO boxes at its first packed row plus the block's;
// rows past its end are the next sequence's, whose lse·log2(e) the preprocess set to +inf in the
// padded workspace, so their P and dS are 0), its keys (loaded by index, zero past its end), its
// causal diagonal, the dropout map of b = s at positions inside it, and its own block-aligned
// region of the dQ workspace (packed_block0 in bwd_traits.cuh).
//
// The pieces, each in its own header: the producer's loads (load_backward_steps,
// bwd_producer.cuh), the deterministic mode's dQ writers (write_staged_dq, bwd_dq.cuh), the
// consumers' K/V load and dS store (load_key_block, store_ds_fragments, bwd_consumer.cuh), the
// step from Sᵀ and dPᵀ to the fragments of Pᵀ∘Z and dSᵀ with its mask policy (plain_step_fragments,
// modifiers_step_fragments, bwd_step.cuh), the dQ epilogue (bwd_dq.cuh), the dK/dV epilogue
// (store_dk_dv, bwd_epilogue.cuh) and the packed tile scheduler (bwd_scheduler.cuh). This file
// keeps the walk of the CTA's tiles and steps, the barriers and the wgmma issue order around them.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/dropout_map.h"
#include "cuda/kernels/common/block_order.h"
#include "cuda/kernels/common/bwd_dbias.cuh"
#include "cuda/kernels/common/cp_async.cuh"
#include "cuda/kernels/common/dropout_frag.cuh"
#include "cuda/kernels/common/mask.cuh"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/score_modifiers.cuh"
#include "cuda/kernels/common/softmax.cuh"
#include "cuda/kernels/common/types.cuh"
#include "cuda/kernels/common/varlen.cuh"
#include "cuda/kernels/sm90/bwd_consumer.cuh"
#include "cuda/kernels/sm90/bwd_dq.cuh"
#include "cuda/kernels/sm90/bwd_epilogue.cuh"
#include "cuda/kernels/sm90/bwd_producer.cuh"
#include "cuda/kernels/sm90/bwd_scheduler.cuh"
#include "cuda/kernels/sm90/bwd_step.cuh"
#include "cuda/kernels/sm90/bwd_traits.cuh"
#include "cuda/kernels/sm90/bwd_variant.cuh"
#include "cuda/kernels/sm90/ptx.cuh"
#include "cuda/kernels/sm90/wgmma_ops.cuh"

namespace memeff::cuda::sm90 {

// kBiasTiles: a 16-bit bias that varies over queries arrives by TMA with each step's Q and dO,
// into the step's dS buffer (see the producer below); else a bias is read per score.
//
// kMods: the instantiations with ALiBi and the softcap (ScoreMods), for calls that have either,
// and for dense windowed calls without a bias or with one read per score. Four per dtype and
// head dim: with a bias
// (kDropout, kBias, kCap = ModsCap::run_time), whose dropout, bias and cap follow the params at
// run time (a bias when p.bias is set, read per score); without one, with the cap fixed at
// compile time, and dropout too where there is no cap (with the cap, dropout at run time: ptxas,
// sm_90a, head dim 64: the cap's kernel compiled without dropout spilled 554 bytes against 392
// with it, and ran slower on the GPU). Fixing them keeps the registers the run-time checks take
// (the general kernel spilled up to 1 GB of local traffic at head dim 128; docs/benchmarks.md).
// All take packed calls at run time (kPacked false), and their step computes P and dS in its own
// code (the kMods branch of the main loop). The packed instantiations and those of bias tiles
// take the window alone, behind tests of p.mods.flags the whole CTA takes alike.
//
// kAlibi: whether a modifiers' kernel has ALiBi's term. Two more per dtype and head dim, one per
// dropout, have none (and no cap nor bias), for the dense windowed calls without ALiBi: with the
// term computed for a slope of 0 their backward took 0.6-5.4% longer (H100, docs/benchmarks.md).
//
// kDet: the deterministic mode (its writer warps, staged dQ and walk), one of each instantiation
// above. Compiled into the default kernels behind a run-time test, its code cost them 4-16% of
// their speed at p 0 (H100, sixteenth session in docs/benchmarks.md: the registers and the
// consumers' arrivals it takes).
template <class T, class Tr, bool kDropout, bool kBias, bool kPacked, bool kBiasTiles,
          bool kMods = false, ModsCap kCap = ModsCap::run_time, bool kAlibi = true,
          bool kDet = false>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    attention_backward_kernel(const __grid_constant__ BackwardTmaParams tp) {
  using V = BackwardVariant<T, Tr, kDropout, kBias, kPacked, kBiasTiles, kMods, kCap, kAlibi, kDet>;
  [[maybe_unused]] constexpr bool kRuntimeDropout = V::kRuntimeDropout;
  [[maybe_unused]] constexpr bool kWindowCode = V::kWindowCode;
  [[maybe_unused]] constexpr bool kPersist = V::kPersist;
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Compiled for another target (sm_80): wgmma and setmaxnreg exist only in sm_90a, and the
  // launcher runs this kernel on compute capability 9.0 alone.
  __trap();
#else
  constexpr int kNT = Tr::kNT, kDT = Tr::kDT, kStages = Tr::kStages;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kHeadDim = Tr::kHeadDim;
  const BackwardParams& p = tp.p;
  // What the params switch on at run time in the modifiers' kernel (constants elsewhere).
  const bool packed_call = kPacked || (kMods && p.cu_seqlens_q != nullptr);
  const bool has_bias = kBias && (!kMods || p.bias != nullptr);
  const bool dropout_on = kDropout && (!kRuntimeDropout || p.has_dropout);
  const bool window = kWindowCode && (p.mods.flags & ScoreMods::kWindow) != 0;

  // Inline on purpose: as a BackwardSmem struct (methods for these lambdas) the PTX changed.
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const std::uint32_t raw = smem_addr(smem_raw);
  const std::uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* const smem = smem_raw + (base - raw);  // the same address, as a pointer
  const std::uint32_t sK = base + Tr::kOffK, sV = base + Tr::kOffV;
  auto sQ = [&](int s) { return base + Tr::kOffQ + s * Tr::kQBytes; };
  auto sDo = [&](int s) { return base + Tr::kOffDo + s * Tr::kQBytes; };
  auto full = [&](int s) { return base + Tr::kOffBar + 8u * s; };
  auto empty = [&](int s) { return base + Tr::kOffBar + 8u * (kStages + s); };
  // The deterministic mode: consumer w's dQ of item `it` is staged in the dO buffer of the item's
  // stage (w = 0) or in its dS buffer (w = 1), its workspace chunk and turn in slot (stage, w).
  auto staged = [&](int s, int w) {
    return base + Tr::kOffBar + 8u * (2 * kStages + s * Tr::kConsumers + w);
  };
  auto dq_stage = [&](int it, int w) {
    return w == 0 ? sDo(it % kStages) : base + Tr::kOffDs + (it & 1) * Tr::kDsBytes;
  };
  auto dq_slot = [&](int s, int w) {
    return reinterpret_cast<volatile DqSlot*>(smem + Tr::kOffSlots) + s * Tr::kConsumers + w;
  };

  const int tid = threadIdx.x;
  // Broadcast from lane 0 so the compiler knows the role is warp-uniform.
  const int warpgroup = __shfl_sync(0xFFFFFFFFu, tid / 128, 0);
  // Packed: the CTA's key block and sequence (an extra CTA-wide barrier); one past the last tile
  // leaves at once, every thread, before any barrier is set up. The dense code below reads the
  // problem's values wherever a packed call reads the sequence's (packed_call ? pk.x : p.x).
  // The consumers read the values their main loop needs (keys, first key row, workspace block)
  // from pk_smem where they use them, not from registers held through the loop: the head-dim-128
  // backward is at its register limit.
  [[maybe_unused]] PackedKeyBlock pk{};
  [[maybe_unused]] const PackedKeyBlock* pk_smem = nullptr;
  if (packed_call) {
    pk_smem = packed_key_block_of_cta<kBlockN, kBlockM>(p);
    pk = *pk_smem;
    if (!pk.valid) return;
  }
  // Inline on purpose: as a scheduler struct the PTX changed (the producer, a function of its own,
  // reads b, kvh and n0 by reference, which next_tile moves).
  // Dense: key block y of (batch, kv head) z·gridDim.x + x: the grid's order in bands of
  // gridDim.x heads (bwd_traits.cuh, common/block_order.h). Plain expressions of the block index:
  // computing the order (a division) cost the main loop registers and spills. A persistent grid
  // (kPersist with tp.persist_tiles set): tiles blockIdx.x, + gridDim.x, ... of the
  // persist_tiles, tile t being key block t % persist_key_blocks of (batch, kv head)
  // t / persist_key_blocks (next_tile below moves to the next).
  [[maybe_unused]] int tile = static_cast<int>(blockIdx.x);
  int key_block = packed_call ? pk.block : static_cast<int>(blockIdx.y) + tp.key_block_base;
  int y = packed_call ? static_cast<int>(blockIdx.y)
                      : static_cast<int>(blockIdx.z * gridDim.x + blockIdx.x) + tp.head_base;
  if constexpr (kPersist) {
    if (tp.persist_tiles > 0) {
      key_block = tile % tp.persist_key_blocks;
      y = tile / tp.persist_key_blocks;
    }
  }
  // Packed: b = the sequence (the dropout map's b; the b strides are 0), grid y the kv head.
  int b = packed_call ? pk.seq : y / p.Hkv, kvh = packed_call ? y : y % p.Hkv;
  std::int64_t n0 = static_cast<std::int64_t>(key_block) * kBlockN;

  // Query blocks that see any key of this block: all, or (causal) those with a row i where
  // n0 <= i + shift for some i in the block; a window also ends them (KeyMask::query_blocks).
  const int m_blocks = packed_call ? (pk.Lq + kBlockM - 1) / kBlockM : tp.m_blocks;
  const std::int64_t block_Lk = packed_call ? pk.Lk : p.Lk;
  const std::int64_t block_shift = packed_call ? pk.causal_shift : p.causal_shift;
  int m_begin =
      KeyMask{is_causal(p), block_Lk, block_shift}.first_query_block<kBlockM>(n0, m_blocks);
  int m_count = m_blocks - m_begin;
  if constexpr (kWindowCode) {
    if (window) {
      const BlockRange range =
          KeyMask{is_causal(p), block_Lk, block_shift, p.mods.left_reach, p.mods.right_reach}
              .query_blocks<kBlockM, kBlockN>(n0, m_blocks);
      m_begin = range.begin;
      m_count = range.count();
    }
  }
  const int items = m_count * p.group;  // (query head of the group, query block) steps
  // Their order: head by head from the first query block, or in the deterministic mode under a
  // right bound from the last (common/block_order.h).
  const BackwardWalk walk{m_begin, m_count, p.group, kDet && tp.walk_from_last};
  // A persistent grid's next tile into the values above (the kernels of kPersist are dense,
  // without a window, and the launcher sets persist_tiles only without a causal mask): false
  // once the CTA's tiles are done, and at once elsewhere.
  auto next_tile = [&]() -> bool {
    if constexpr (!kPersist) {
      return false;
    } else {
      tile += static_cast<int>(gridDim.x);
      if (tp.persist_tiles == 0 || tile >= tp.persist_tiles) return false;
      key_block = tile % tp.persist_key_blocks;
      y = tile / tp.persist_key_blocks;
      b = y / p.Hkv;
      kvh = y % p.Hkv;
      n0 = static_cast<std::int64_t>(key_block) * kBlockN;
      // Without a causal mask or a window every tile walks all query blocks of its heads: the
      // walk and its item count stay the first tile's.
      return true;
    }
  };

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full(s), 1);
      if constexpr (kDet) {
        // One arrival per consumer thread and one per dQ writer.
        mbar_init(empty(s), 128 * Tr::kConsumers + Tr::kConsumers);
#pragma unroll
        for (int w = 0; w < Tr::kConsumers; ++w) mbar_init(staged(s, w), 128);
      } else {
        mbar_init(empty(s), 4 * Tr::kConsumers);  // one arrival per consumer warp
      }
    }
    fence_barrier_init();
  }
  __syncthreads();  // the last CTA-wide barrier: the producer's idle warps leave below

  if (warpgroup == 0) {
    // ---------------- producer ----------------
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0 && items > 0) {
      load_backward_steps<Tr, kBiasTiles>(tp, p, walk, items, b, kvh, n0, packed_call, pk.q0, base,
                                          sQ, sDo, full, empty, next_tile);
    } else if (kDet && items > 0 && tid % 32 == 0 && tid / 32 >= 1 && tid / 32 <= Tr::kConsumers) {
      // ---------------- deterministic dQ writers (lane 0 of warps 1 .. kConsumers) ----------
      write_staged_dq<Tr>(tp, p, tid / 32 - 1, items, packed_call, staged, dq_slot, dq_stage,
                          empty);
    }
    return;
  }

  // ---------------- consumers ----------------
  setmaxnreg_inc<Tr::kConsumerRegs>();
  const int wg = warpgroup - 1;  // consumer index: keys 64·wg .. 64·wg + 63 of the block
  const int ctid = tid - 128 * warpgroup;  // thread within the warpgroup
  const int warp = ctid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // The sequence's keys (dense: the problem's, read from the params where used: a local copy would
  // hold two more registers through the main loop); packed: its first key row and its first query
  // block in the workspace's per-head layout.
  // (The modifiers' kernel tells packed calls apart at run time; the others at compile time,
  // which keeps their main loops' code as it was.)
  auto seq_Lk = [&]() -> std::int64_t {
    if constexpr (kPacked || kMods) {
      return packed_call ? pk_smem->Lk : p.Lk;
    } else {
      return p.Lk;
    }
  };
  auto k0 = [&]() -> std::int64_t {
    if constexpr (kPacked || kMods) {
      return packed_call ? pk_smem->k0 : 0;
    } else {
      return 0;
    }
  };
  [[maybe_unused]] auto m_base = [&]() -> std::int64_t {
    if constexpr (kPacked || kMods) {
      return packed_call ? pk_smem->m_base : 0;
    } else {
      return 0;
    }
  };

  // The CTA's tiles (one but with kPersist); step0: the ring's steps of the earlier ones.
  for (int step0 = 0;;) {
    load_key_block<T, Tr>(smem, p, b, kvh, n0, k0, seq_Lk, wg, ctid);

    detail::DropoutKey rng_key{0u, 0u};
    if (dropout_on) {
      const std::uint64_t seed = p.seed_ptr ? *p.seed_ptr : p.seed;
      const std::uint64_t offset = p.offset_ptr ? *p.offset_ptr : p.offset;
      rng_key = detail::dropout_key(seed, offset);
    }
    // dV, dK, dQ and dbias are accumulated from Pᵀ∘M and dSᵀ / keep_scale (see the dS step).
    const float ds_scale = dropout_on ? p.keep_scale : 1.0f;
    const bool causal = is_causal(p);
    const std::int64_t causal_shift = packed_call ? pk.causal_shift : p.causal_shift;
    // This thread's keys (its rows of Sᵀ in row halves 0 and 1): key0 and key0 + 1.
    const std::int64_t key0 = n0 + 64 * wg + 8 * g + 2 * warp;
    // The dropout map's block of these keys and (below) rows: global coordinates (params.h).
    const std::uint64_t key_block64 = static_cast<std::uint64_t>((n0 + 64 * wg) / 64) + p.k_block64;

    float dk[kDT][4], dv[kDT][4];
#pragma unroll
    for (int j = 0; j < kDT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) dk[j][r] = dv[j][r] = 0.0f;

    // Descriptors: this warpgroup's K and V rows (A, K-major); the stage's Q and dO as the B of
    // Sᵀ, dPᵀ (K-major) and of dK, dV (N-major, N = head dim); dS (A of dQ, M-major) and K (B of
    // dQ, N-major). Stages and steps move only the start address.
    const std::uint64_t k_desc = smem_desc_sw128(sK + wg * 64 * 128, 16, 1024);
    const std::uint64_t v_desc = smem_desc_sw128(sV + wg * 64 * 128, 16, 1024);
    const std::uint64_t q_desc_k = smem_desc_sw128(sQ(0), 16, 1024);
    const std::uint64_t do_desc_k = smem_desc_sw128(sDo(0), 16, 1024);
    const std::uint64_t q_desc_n = smem_desc_sw128(sQ(0), Tr::kQBlockBytes, 1024);
    const std::uint64_t do_desc_n = smem_desc_sw128(sDo(0), Tr::kQBlockBytes, 1024);
    const std::uint64_t ds_desc = smem_desc_sw128(
        base + Tr::kOffDs + (Tr::kDqSplitRows ? wg * kBlockN * 128 : 0), kBlockN * 128, 1024);
    const std::uint64_t kdq_desc = smem_desc_sw128(
        sK + (Tr::kDqSplitRows ? 0 : wg * Tr::kKVBlockBytes), Tr::kKVBlockBytes, 1024);

    const DbiasMode dbias_mode = has_bias ? tp.dbias_mode : DbiasMode::none;
    const std::int64_t bias_b = has_bias ? b * p.bias_stride.b : 0;
    const float score_limit = has_bias ? bias_score_limit(p.scale) : 0.0f;

    // Dropout keep-bits of an item: keep[kb] nibble n' bit 2e + h is the element of row half h
    // and column e of n8 tile 8·kb + n'. Drawn while the tensor cores run the item's Sᵀ and dPᵀ
    // (measured on the H200: drawing the next item's under dV, dK and dQ instead was 2% slower on
    // the head-dim-128 shapes and spilled with 128 queries per step). The modifiers' kernel without
    // dropout keeps every element (words of ones: no Philox calls).
    constexpr int kKeepWords = kDropout ? kNT / 8 : 1;
    auto draw_keep = [&](int item, std::uint32_t(&words)[kKeepWords]) {
      if (kDropout && !dropout_on) {
#pragma unroll
        for (int kb = 0; kb < kKeepWords; ++kb) words[kb] = ~0u;
      } else if constexpr (kDropout) {
        const int hg = walk.head(item), m = walk.block(item);
        const std::uint64_t bh = static_cast<std::uint64_t>(b) * p.Hq + kvh * p.group + hg;
        const std::int64_t m0 = static_cast<std::int64_t>(m) * kBlockM;
#pragma unroll
        for (int kb = 0; kb < kNT / 8; ++kb) {
          std::uint32_t bits[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const std::int64_t i = m0 + 64 * kb + 8 * g + 2 * t + e;
            bits[e] = keep_bits16_fast(
                detail::dropout_call(rng_key, bh, static_cast<std::uint64_t>(i) + p.q_start,
                                     key_block64, static_cast<std::uint32_t>(warp)),
                p.keep_threshold);
          }
          words[kb] =
              transpose_nibbles8(spread_bit_pairs(bits[0]) | (spread_bit_pairs(bits[1]) << 2), g);
        }
      }
    };
    std::uint32_t keep[kKeepWords] = {};

    // lse·log2(e) and delta of an item's queries, copied by each consumer warpgroup into its own
    // double buffer one item ahead (ordinary asynchronous copies) by warps 1 .. 2·kStatChunks/32.
    // (Not warp 0 since dQ went out by bulk reductions from its thread 0, which the hardware counts
    // with the same scoreboard as cp.async: waiting for the copies waited for the last reduction
    // too, 12% of the gpt-2k backward on the H200. dQ's reductions are ordinary ones now.)
    constexpr int kStatChunks = Tr::kStatBytes / 16;
    const int stat_copy = ctid - 32;  // this thread's 16-byte chunk, when in [0, 2·kStatChunks)
    const bool stat_copier = stat_copy >= 0 && stat_copy < 2 * kStatChunks;  // whole warps
    auto stats = [&](int buffer, int array) {
      return smem + Tr::kOffStats + ((wg * 2 + buffer) * 2 + array) * Tr::kStatBytes;
    };
    auto prefetch_stats = [&](int item) {
      if (stat_copier) {
        const int hg = walk.head(item), m = walk.block(item);
        std::int64_t row;
        if (packed_call) {  // the sequence's region of head h (b strides are 0)
          row = (static_cast<std::int64_t>(kvh * p.group + hg) * tp.m_blocks + m_base() + m) *
                kBlockM;
        } else {
          row = (static_cast<std::int64_t>(b) * p.Hq + kvh * p.group + hg) * tp.lq_pad +
                static_cast<std::int64_t>(m) * kBlockM;
        }
        const int array = stat_copy / kStatChunks, chunk = stat_copy % kStatChunks;
        const float* src = (array == 0 ? tp.lse_log2 : p.softmax_d) + row + 4 * chunk;
        cp_async_16(stats(item & 1, array) + 16 * chunk, src, 16);
        cp_async_commit();
      }
    };
    if (items > 0) prefetch_stats(0);

    for (int it = 0; it < items; ++it) {
      const int s = (step0 + it) % kStages, buf = it & 1;
      const std::uint32_t phase = ((step0 + it) / kStages) & 1;
      const int hg = walk.head(it), m = walk.block(it);
      const int h = kvh * p.group + hg;
      const std::int64_t bh = static_cast<std::int64_t>(b) * p.Hq + h;
      const std::int64_t m0 = static_cast<std::int64_t>(m) * kBlockM;
      // This item's stats have landed (this thread's copies, then the warpgroup's); the other
      // buffer was last read in the previous item, which every thread of the warpgroup has left.
      if (stat_copier) cp_async_wait<0>();
      named_bar_sync(Tr::kStatBarrier + wg, 128);
      if (it + 1 < items) prefetch_stats(it + 1);
      const float* lse_s = reinterpret_cast<const float*>(stats(it & 1, 0));
      const float* delta_s = reinterpret_cast<const float*>(stats(it & 1, 1));

      // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: 64 keys x kBlockM queries each.
      float sacc[kNT][4], dpacc[kNT][4];
      mbar_wait(full(s), phase);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < Tr::kSdPSteps; ++ks) {
        const std::uint32_t a_off = (ks / 4) * Tr::kKVBlockBytes + (ks % 4) * 32;
        const std::uint32_t b_off = s * Tr::kQBytes + (ks / 4) * Tr::kQBlockBytes + (ks % 4) * 32;
        Wgmma<T, kBlockM>::template ss<0, 0>(sacc, desc_advance(k_desc, a_off),
                                             desc_advance(q_desc_k, b_off), ks > 0 ? 1 : 0);
      }
      wgmma_commit();
#pragma unroll
      for (int ks = 0; ks < Tr::kSdPSteps; ++ks) {
        const std::uint32_t a_off = (ks / 4) * Tr::kKVBlockBytes + (ks % 4) * 32;
        const std::uint32_t b_off = s * Tr::kQBytes + (ks / 4) * Tr::kQBlockBytes + (ks % 4) * 32;
        Wgmma<T, kBlockM>::template ss<0, 0>(dpacc, desc_advance(v_desc, a_off),
                                             desc_advance(do_desc_k, b_off), ks > 0 ? 1 : 0);
      }
      wgmma_commit();
      draw_keep(it, keep);

      // Whether the step's (keys, queries) tile needs the element mask: the window's test in the
      // instantiations that have it (when the call has one), else the causal mask's and Lk's.
      bool need_mask = n0 + kBlockN > seq_Lk() || (causal && n0 + kBlockN - 1 > m0 + causal_shift);
      if constexpr (kWindowCode) {
        if (window) {
          need_mask = KeyMask{causal, seq_Lk(), causal_shift, p.mods.left_reach, p.mods.right_reach}
                          .template tile_needs_mask<kBlockM, kBlockN>(m0, n0);
        }
      }
      // Pᵀ∘Z and dSᵀ as wgmma A fragments (16 queries per k-step).
      std::uint32_t pf[Tr::kKVSteps][4], dsf[Tr::kKVSteps][4];
      if constexpr (kMods) {
        modifiers_step_fragments<T, Tr, kDropout, kCap, kAlibi>(
            tp, p, sacc, dpacc, pf, dsf, lse_s, delta_s, keep, smem, buf, has_bias, dbias_mode,
            ds_scale, score_limit, bias_b, b, h, m0, key0, need_mask, window, causal, causal_shift,
            packed_call, seq_Lk, wg, warp, g, t);
      } else {
        plain_step_fragments<T, Tr, kDropout, kBias, kBiasTiles, kWindowCode>(
            tp, p, sacc, dpacc, pf, dsf, lse_s, delta_s, keep, smem, buf, has_bias, dbias_mode,
            ds_scale, score_limit, bias_b, b, h, m0, key0, need_mask, window, causal, causal_shift,
            packed_call, seq_Lk, wg, warp, g, t);
      }

      // dV += (Pᵀ∘Z)·dO, issued before dSᵀ goes to shared memory; then, once both warpgroups'
      // dSᵀ is there, dQ = dS·K (this warpgroup's 64 x 64 over the block's 128 keys) and dK +=
      // dSᵀ·Q, in that order, so that dQ's reductions into the workspace are issued while the
      // tensor cores run dK.
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Tr::kKVSteps; ++kk) {
        Wgmma<T, kHeadDim>::template rs<1>(
            dv, pf[kk], desc_advance(do_desc_n, s * Tr::kQBytes + kk * 16 * 128), 1);
      }
      wgmma_commit();

      // dSᵀ to shared memory: [query / 64][key row][64 queries], 16-byte chunks swizzled by row.
      {
        // With bias tiles, every warp of the warpgroup has read its entries before any writes dS
        // over them.
        if constexpr (kBiasTiles) named_bar_sync(Tr::kBiasBarrier + wg, 128);
        // The deterministic mode: dS buffer buf held item it - 2's staged dQ, until its writer's
        // reduction read it (the writers then arrive on that item's empty barrier).
        if (kDet && it >= 2) {
          mbar_wait(empty((it - 2) % kStages), ((it - 2) / kStages) & 1);
        }
        store_ds_fragments<Tr>(smem + Tr::kOffDs + buf * Tr::kDsBytes, dsf, wg, warp, g, t);
        fence_proxy_async_smem();
        named_bar_sync(Tr::kConsumerBarrier, 128 * Tr::kConsumers);  // both halves of dS written
      }

      // dQ (64 x 64 of this warpgroup) = dS·K over the block's 128 keys.
      float dq[8][4];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Tr::kDqSteps; ++kk) {
        Wgmma<T, 64>::template ss<1, 1>(dq, desc_advance(ds_desc, buf * Tr::kDsBytes + kk * 2048),
                                        desc_advance(kdq_desc, kk * 2048), kk > 0 ? 1 : 0);
      }
      wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < Tr::kKVSteps; ++kk) {
        Wgmma<T, kHeadDim>::template rs<1>(
            dk, dsf[kk], desc_advance(q_desc_n, s * Tr::kQBytes + kk * 16 * 128), 1);
      }
      wgmma_commit();
      wgmma_wait<1>();  // dV and dQ
      fence_operands(dq);

      // dQ into the workspace chunk of (bh, m, wg), in the order bwd_convert_dq_kernel reads.
      auto dq_chunk = [&]() -> std::int64_t {
        if (packed_call) {
          return (static_cast<std::int64_t>(h) * tp.m_blocks + m_base() + m) * 2 + wg;
        }
        return (bh * m_blocks + m) * 2 + wg;
      };
      if constexpr (kDet) {
        // The key blocks that add into a chunk take turns, in key block order: a run of
        // consecutive ones (KeyMask: from the first key tile of query block m, 0 without a left
        // window bound), this one's turn being its place in the run. The warpgroup stages its dQ
        // in the step's dO (wg 0) or dS (wg 1) buffer, in the workspace chunk's order, once both
        // warpgroups' dV and dQ products have read them, and its writer adds it when the turn
        // comes; the tensor cores run dK meanwhile.
        int turn_of_block = key_block;
        if constexpr (kWindowCode) {
          if (window) {
            turn_of_block -=
                KeyMask{causal, seq_Lk(), causal_shift, p.mods.left_reach, p.mods.right_reach}
                    .template key_tile_range<kBlockM, kBlockN>(m0)
                    .begin;
          }
        }
        named_bar_sync(Tr::kConsumerBarrier, 128 * Tr::kConsumers);  // dO(s), dS(buf) read
        stage_dq_fragments(smem + (dq_stage(it, wg) - base), dq, ctid);
        fence_proxy_async_smem();  // written by ordinary stores, read by the bulk reduction
        if (ctid == 0) {
          dq_slot(s, wg)->chunk = dq_chunk();
          dq_slot(s, wg)->turn = turn_of_block;
        }
        mbar_arrive(staged(s, wg));
      } else {
        add_dq_fragments(p.dq_accum + dq_chunk() * Tr::kDqFloats, dq, ctid);
      }
      wgmma_wait<0>();
      fence_operands(dk);
      fence_operands(dv);
      // Done with the stage's Q, dO, lse, delta. In the deterministic mode every thread arrives
      // (a test of the lane there recomputed the thread index into a register the writers' code
      // kept busy: a wait of 7% of the step, ptxas for sm_90a), and the writers once their
      // reductions have read the staged dQ; elsewhere one arrival per warp.
      if constexpr (kDet) {
        mbar_arrive(empty(s));
      } else if (lane == 0) {
        mbar_arrive(empty(s));
      }
    }

    // The deterministic mode: every staged dQ read by its writer before the buffers hold dK, dV
    // (the writers arrive on a stage's empty barrier once its reduction has read it).
    if constexpr (kDet) {
      for (int it = items > kStages ? items - kStages : 0; it < items; ++it) {
        mbar_wait(empty(it % kStages), (it / kStages) & 1);
      }
    }
    // dK·scale and dV (times keep_scale, see the dS step) to their rows in global memory, through
    // the Q, dO and dS buffers (free now: every TMA load was consumed and every wgmma waited for);
    // with kPersist through the K and V buffers instead (as free: the last wgmma reading them was
    // waited for), as the producer may be loading the next tile's Q and dO.
    named_bar_sync(Tr::kConsumerBarrier, 128 * Tr::kConsumers);
    store_dk_dv<T, Tr>(dk, dv, p.scale * ds_scale, ds_scale,
                       smem + (kPersist ? Tr::kOffK : Tr::kOffQ), p, b, kvh, n0, k0, seq_Lk, wg,
                       ctid, warp, g, t);
    if constexpr (!kPersist) {
      break;
    } else {
      step0 += items;
      if (!next_tile()) break;
      // Every thread's copies out of the K and V buffers done before the next tile's K and V.
      named_bar_sync(Tr::kConsumerBarrier, 128 * Tr::kConsumers);
    }
  }
#endif
}

}  // namespace memeff::cuda::sm90
