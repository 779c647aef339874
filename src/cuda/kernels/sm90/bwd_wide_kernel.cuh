// The sm90 backward for head dims 129-256 (bucket 256, BwdWideTraits in bwd_traits.cuh):
// warp-specialized, TMA-fed, wgmma-based, like bwd_kernel.cuh, with a tile the registers allow.
//
// One CTA per key block of kBlockN = 64 keys and (batch, kv head); it walks the query blocks of
// 64 queries (and the query heads of its kv head) that see any of its keys. Warpgroup 0 is the
// producer (TMA of each step's Q and dO into a two-stage ring); warpgroups 1 and 2 are the
// consumers. dK and dV (64 keys x 256) would take all of one warpgroup's registers, so consumer w
// owns head-dim columns 128w .. 128w + 127 of both, and per step:
//   Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for its query half (64 keys x 32 queries; wgmma, operands in smem),
//   Pᵀ = exp2(Sᵀ·scale·log2 e − lse·log2 e), dSᵀ = Pᵀ ∘ (Z ∘ dPᵀ − delta)   (registers),
//   Pᵀ∘Z and dSᵀ to shared memory ([key row][64 queries], both halves, once both have written),
//   dQ = dS·K for its columns (dS read M-major), added to the fp32 workspace by 16-byte vector
//   reductions straight from the accumulators, in the fragment order bwd_convert_dq_kernel
//   reads, while the tensor cores run
//   dV += (Pᵀ∘Z)·dO and dK += dSᵀ·Q for its columns (A from shared memory, K-major).
// dK and dV are written once at the end (summed over the query heads of a GQA group).
//
// Dropout in the Sᵀ orientation from the documented map (docs/dropout.md), bit for bit: K and V
// rows are permuted inside the 64-key block as in bwd_kernel.cuh (warp w's rows hold the keys of
// column class w), so one Philox call of (query, block, class w) serves the eight lanes of a lane
// column. Each lane draws one call per step (the 8 queries of its lane column, 2 bits for each
// lane) and the eight trade their shares with one 8 x 8 nibble transpose.
//
// The K/V load, the Sᵀ and dPᵀ products and the copy of dK and dV to global memory are
// bwd_kernel.cuh's, written out for this tile's constants. As functions shared by both kernels
// they moved the 128-key tile's address arithmetic (ptxas, sm_90a: the K/V load as a call spilled
// 12 more bytes in its head-dim-128 dropout kernel), so each keeps its own.
//
// This tile takes dense calls without a bias, window, ALiBi or softcap (Family::backward_reasons
// says so; the `cuda` backend runs those), with dropout, either causal alignment, GQA, global
// coordinates and the deterministic mode.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/dropout_map.h"
#include "cuda/kernels/common/cp_async.cuh"
#include "cuda/kernels/common/dropout_frag.cuh"
#include "cuda/kernels/common/mask.cuh"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/softmax.cuh"
#include "cuda/kernels/common/types.cuh"
#include "cuda/kernels/sm90/bwd_kernel.cuh"
#include "cuda/kernels/sm90/bwd_traits.cuh"
#include "cuda/kernels/sm90/ptx.cuh"
#include "cuda/kernels/sm90/wgmma_ops.cuh"

namespace memeff::cuda::sm90 {

// The wide tile's keep words: a lane of lane column t draws query 8(g / 2) + 2t + (g % 2) of its
// warpgroup's 32 (n8 tile g / 2, column g % 2) for the 16 keys of its warp's class; after the
// transpose, nibble 2n + e holds the bits of n8 tile n, column e, bit h for row half h. All ones
// where element (n, r) of the Sᵀ fragment is kept, 0 where dropped.
__device__ __forceinline__ std::uint32_t wide_kept_mask(std::uint32_t keep, int n, int r) {
  const int bit = 8 * n + 4 * (r & 1) + (r >> 1);
  return static_cast<std::uint32_t>(static_cast<std::int32_t>(keep << (31 - bit)) >> 31);
}

template <class T, bool kDropout>
__global__ void __launch_bounds__(BwdWideTraits::kThreads, 1)
    attention_backward_wide_kernel(const __grid_constant__ BackwardTmaParams tp) {
  using Tr = BwdWideTraits;
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Compiled for another target (sm_80): the launcher runs this kernel on compute capability 9.0
  // alone.
  __trap();
#else
  constexpr int kNT = Tr::kNT, kHalfDT = Tr::kHalfDT, kStages = Tr::kStages;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN;
  const BackwardParams& p = tp.p;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const std::uint32_t raw = smem_addr(smem_raw);
  const std::uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* const smem = smem_raw + (base - raw);  // the same address, as a pointer
  const std::uint32_t sK = base + Tr::kOffK, sV = base + Tr::kOffV;
  auto sQ = [&](int s) { return base + Tr::kOffQ + s * Tr::kQBytes; };
  auto sDo = [&](int s) { return base + Tr::kOffDo + s * Tr::kQBytes; };
  auto full = [&](int s) { return base + Tr::kOffBar + 8u * s; };
  auto empty = [&](int s) { return base + Tr::kOffBar + 8u * (kStages + s); };

  const int tid = threadIdx.x;
  const int warpgroup = __shfl_sync(0xFFFFFFFFu, tid / 128, 0);
  // Key block y of (batch, kv head) z·gridDim.x + x (bands of heads, common/block_order.h).
  const int key_block = static_cast<int>(blockIdx.y) + tp.key_block_base;
  const int y = static_cast<int>(blockIdx.z * gridDim.x + blockIdx.x) + tp.head_base;
  const int b = y / p.Hkv, kvh = y % p.Hkv;
  const std::int64_t n0 = static_cast<std::int64_t>(key_block) * kBlockN;
  const bool causal = is_causal(p);
  const int m_blocks = tp.m_blocks;
  const int m_begin =
      KeyMask{causal, p.Lk, p.causal_shift}.first_query_block<kBlockM>(n0, m_blocks);
  const int m_count = m_blocks - m_begin;
  const int items = m_count * p.group;  // (query head of the group, query block) steps
  // Their order: head by head from the first query block, or in the deterministic mode under a
  // right bound from the last (common/block_order.h).
  const BackwardWalk walk{m_begin, m_count, p.group, tp.walk_from_last};

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), 4 * Tr::kConsumers);  // one arrival per consumer warp
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ---------------- producer ----------------
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0 && items > 0) {
      prefetch_tensor_map(&tp.q);
      prefetch_tensor_map(&tp.dout);
      for (int it = 0; it < items; ++it) {
        const int s = it % kStages;
        const std::uint32_t phase = (it / kStages) & 1;
        const int hg = walk.head(it), m = walk.block(it);
        const int h = kvh * p.group + hg;
        mbar_wait(empty(s), phase ^ 1);
        mbar_arrive_expect_tx(full(s), 2 * Tr::kQBytes);
#pragma unroll
        for (int db = 0; db < Tr::kDBlocks; ++db) {
          tma_load_4d(sQ(s) + db * Tr::kQBlockBytes, &tp.q, full(s), 64 * db, m * kBlockM, h, b);
          tma_load_4d(sDo(s) + db * Tr::kQBlockBytes, &tp.dout, full(s), 64 * db, m * kBlockM, h,
                      b);
        }
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  setmaxnreg_inc<Tr::kConsumerRegs>();
  const int wg = warpgroup - 1;  // consumer index: queries 32·wg .. of Sᵀ, columns 128·wg .. of dK
  const int ctid = tid - 128 * warpgroup;
  const int warp = ctid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

  // K and V of the key block (dense calls: keys counted from row 0, up to Lk).
  load_key_block<T, Tr>(
      smem, p, b, kvh, n0, [] { return std::int64_t{0}; }, [&] { return p.Lk; }, wg, ctid);

  detail::DropoutKey rng_key{0u, 0u};
  if constexpr (kDropout) {
    const std::uint64_t seed = p.seed_ptr ? *p.seed_ptr : p.seed;
    const std::uint64_t offset = p.offset_ptr ? *p.offset_ptr : p.offset;
    rng_key = detail::dropout_key(seed, offset);
  }
  // dV, dK and dQ are accumulated from Pᵀ∘M and dSᵀ / keep_scale (bwd_kernel.cuh's dS step).
  const float ds_scale = kDropout ? p.keep_scale : 1.0f;
  // This thread's keys (its rows of Sᵀ in row halves 0 and 1): key0 and key0 + 1.
  const std::int64_t key0 = n0 + 8 * g + 2 * warp;
  const std::uint64_t key_block64 = static_cast<std::uint64_t>(n0 / 64) + p.k_block64;

  float dk[kHalfDT][4], dv[kHalfDT][4];
#pragma unroll
  for (int j = 0; j < kHalfDT; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) dk[j][r] = dv[j][r] = 0.0f;

  // Descriptors: K and V (A of Sᵀ, dPᵀ; K-major); the stage's Q and dO rows of this warpgroup's
  // queries (B of Sᵀ, dPᵀ; K-major) and its columns (B of dK, dV; N-major, two 64-column
  // blocks); Pᵀ∘Z and dSᵀ (A of dV, dK; K-major) and dSᵀ read as dS (A of dQ, M-major); K's
  // columns of this warpgroup (B of dQ, N-major). Stages and steps move only the start address.
  const std::uint64_t k_desc = smem_desc_sw128(sK, 16, 1024);
  const std::uint64_t v_desc = smem_desc_sw128(sV, 16, 1024);
  const std::uint64_t q_desc_k = smem_desc_sw128(sQ(0) + wg * Tr::kHalfQueries * 128, 16, 1024);
  const std::uint64_t do_desc_k = smem_desc_sw128(sDo(0) + wg * Tr::kHalfQueries * 128, 16, 1024);
  const std::uint64_t q_desc_n =
      smem_desc_sw128(sQ(0) + wg * 2 * Tr::kQBlockBytes, Tr::kQBlockBytes, 1024);
  const std::uint64_t do_desc_n =
      smem_desc_sw128(sDo(0) + wg * 2 * Tr::kQBlockBytes, Tr::kQBlockBytes, 1024);
  const std::uint64_t p_desc = smem_desc_sw128(base + Tr::kOffP, 16, 1024);
  const std::uint64_t ds_desc = smem_desc_sw128(base + Tr::kOffDs, 16, 1024);
  const std::uint64_t ds_desc_m = smem_desc_sw128(base + Tr::kOffDs, Tr::kPBytes, 1024);
  const std::uint64_t kdq_desc =
      smem_desc_sw128(sK + wg * 2 * Tr::kKVBlockBytes, Tr::kKVBlockBytes, 1024);

  // An item's keep word (wide_kept_mask's layout): one Philox call per lane.
  auto draw_keep = [&](int item) -> std::uint32_t {
    if constexpr (kDropout) {
      const int hg = walk.head(item), m = walk.block(item);
      const std::uint64_t bh = static_cast<std::uint64_t>(b) * p.Hq + kvh * p.group + hg;
      const std::int64_t i = static_cast<std::int64_t>(m) * kBlockM + Tr::kHalfQueries * wg +
                             8 * (g >> 1) + 2 * t + (g & 1);
      const std::uint32_t bits = keep_bits16_fast(
          detail::dropout_call(rng_key, bh, static_cast<std::uint64_t>(i) + p.q_start, key_block64,
                               static_cast<std::uint32_t>(warp)),
          p.keep_threshold);
      return transpose_nibbles8(spread_bit_pairs(bits), g);
    } else {
      return ~0u;
    }
  };

  // lse·log2(e) and delta of the warpgroup's 32 queries of an item, copied one item ahead into
  // its double buffer by lanes 0-15 of warp 1 (not warp 0, as in bwd_kernel.cuh).
  constexpr int kStatChunks = Tr::kStatBytes / 16;
  const int stat_copy = ctid - 32;
  const bool stat_copier = stat_copy >= 0 && stat_copy < 2 * kStatChunks;
  auto stats = [&](int buffer, int array) {
    return smem + Tr::kOffStats + ((wg * 2 + buffer) * 2 + array) * Tr::kStatBytes;
  };
  auto prefetch_stats = [&](int item) {
    if (stat_copier) {
      const int hg = walk.head(item), m = walk.block(item);
      const std::int64_t row =
          (static_cast<std::int64_t>(b) * p.Hq + kvh * p.group + hg) * tp.lq_pad +
          static_cast<std::int64_t>(m) * kBlockM + Tr::kHalfQueries * wg;
      const int array = stat_copy / kStatChunks, chunk = stat_copy % kStatChunks;
      const float* src = (array == 0 ? tp.lse_log2 : p.softmax_d) + row + 4 * chunk;
      cp_async_16(stats(item & 1, array) + 16 * chunk, src, 16);
      cp_async_commit();
    }
  };
  if (items > 0) prefetch_stats(0);

  for (int it = 0; it < items; ++it) {
    const int s = it % kStages, buf = it & 1;
    const std::uint32_t phase = (it / kStages) & 1;
    const int hg = walk.head(it), m = walk.block(it);
    const int h = kvh * p.group + hg;
    const std::int64_t bh = static_cast<std::int64_t>(b) * p.Hq + h;
    // The first of this warpgroup's queries.
    const std::int64_t mq = static_cast<std::int64_t>(m) * kBlockM + Tr::kHalfQueries * wg;
    if (stat_copier) cp_async_wait<0>();
    named_bar_sync(Tr::kStatBarrier + wg, 128);
    if (it + 1 < items) prefetch_stats(it + 1);
    const float* lse_s = reinterpret_cast<const float*>(stats(it & 1, 0));
    const float* delta_s = reinterpret_cast<const float*>(stats(it & 1, 1));

    // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: 64 keys x 32 queries each.
    float sacc[kNT][4], dpacc[kNT][4];
    mbar_wait(full(s), phase);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Tr::kSdPSteps; ++ks) {
      const std::uint32_t a_off = (ks / 4) * Tr::kKVBlockBytes + (ks % 4) * 32;
      const std::uint32_t b_off = s * Tr::kQBytes + (ks / 4) * Tr::kQBlockBytes + (ks % 4) * 32;
      Wgmma<T, Tr::kHalfQueries>::template ss<0, 0>(sacc, desc_advance(k_desc, a_off),
                                                    desc_advance(q_desc_k, b_off), ks > 0 ? 1 : 0);
    }
    wgmma_commit();
#pragma unroll
    for (int ks = 0; ks < Tr::kSdPSteps; ++ks) {
      const std::uint32_t a_off = (ks / 4) * Tr::kKVBlockBytes + (ks % 4) * 32;
      const std::uint32_t b_off = s * Tr::kQBytes + (ks / 4) * Tr::kQBlockBytes + (ks % 4) * 32;
      Wgmma<T, Tr::kHalfQueries>::template ss<0, 0>(dpacc, desc_advance(v_desc, a_off),
                                                    desc_advance(do_desc_k, b_off), ks > 0 ? 1 : 0);
    }
    wgmma_commit();
    const std::uint32_t keep = draw_keep(it);

    // Whether the (keys, queries) tile needs the element mask: keys past Lk, or a causal
    // diagonal inside it.
    const bool need_mask =
        n0 + kBlockN > p.Lk || (causal && n0 + kBlockN - 1 > mq + p.causal_shift);

    // Pᵀ = exp2(Sᵀ·scale·log2 e − lse·log2 e), masked (rows past Lq have lse +inf: P = 0).
    wgmma_wait<1>();
    fence_operands(sacc);
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      const float2 l2 = *reinterpret_cast<const float2*>(lse_s + 8 * n + 2 * t);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        sacc[n][r] = fast_exp2(fmaf(sacc[n][r], p.scale_log2, -((r & 1) ? l2.y : l2.x)));
      }
    }
    if (need_mask) {
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const std::int64_t i = mq + 8 * n + 2 * t + (r & 1), j = key0 + (r >> 1);
          if (j >= p.Lk || (causal && j > i + p.causal_shift)) sacc[n][r] = 0.0f;
        }
    }

    // dSᵀ = Pᵀ ∘ (Z ∘ dPᵀ − delta) into dpacc, Pᵀ ∘ Z into sacc (both divided by keep_scale
    // with dropout: bwd_kernel.cuh).
    wgmma_wait<0>();
    fence_operands(dpacc);
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      const float2 dl = *reinterpret_cast<const float2*>(delta_s + 8 * n + 2 * t);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float pv = sacc[n][r], dlt = (r & 1) ? dl.y : dl.x;
        if constexpr (kDropout) {
          const std::uint32_t kept = wide_kept_mask(keep, n, r);
          sacc[n][r] = __uint_as_float(__float_as_uint(pv) & kept);
          dpacc[n][r] = pv * (__uint_as_float(__float_as_uint(dpacc[n][r]) & kept) - dlt);
        } else {
          dpacc[n][r] = pv * (dpacc[n][r] - dlt);
        }
      }
    }
    // kv_block: the row may see other keys elsewhere.
    if (need_mask && !p.kv_block) {
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          // dS is 0 but for a NaN or Inf, which is the data's (docs/api.md).
          if (sees_one_key(mq + 8 * n + 2 * t + e, p.Lk, causal, p.causal_shift)) {
            dpacc[n][e] *= 0.0f;
            dpacc[n][2 + e] *= 0.0f;
          }
        }
    }

    // Pᵀ∘Z and dSᵀ to shared memory: [key row][64 queries], 16-byte chunks swizzled by row; this
    // warpgroup's queries are chunks 4·wg .. 4·wg + 3. Buffer `buf` was last read by step it - 2's
    // products, which both warpgroups waited for before step it - 1's barrier below.
    {
      unsigned char* const p_buf = smem + Tr::kOffP + buf * Tr::kPBytes;
      unsigned char* const ds_buf = smem + Tr::kOffDs + buf * Tr::kPBytes;
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int row = 16 * warp + 8 * hh + g;
          const int off = row * 128 + (((kNT * wg + n) ^ g) << 4) + 4 * t;
          *reinterpret_cast<std::uint32_t*>(p_buf + off) =
              pack2<T>(sacc[n][2 * hh], sacc[n][2 * hh + 1]);
          *reinterpret_cast<std::uint32_t*>(ds_buf + off) =
              pack2<T>(dpacc[n][2 * hh], dpacc[n][2 * hh + 1]);
        }
      fence_proxy_async_smem();
      named_bar_sync(Tr::kConsumerBarrier, 128 * Tr::kConsumers);  // both halves written
    }

    // dQ = dS·K over the 64 keys, then dV += (Pᵀ∘Z)·dO and dK += dSᵀ·Q over the step's 64
    // queries, this warpgroup's 128 columns of each; dQ's reductions are issued while the tensor
    // cores run dV and dK (measured on the H100: 8-13% faster than after all three).
    float dq[kHalfDT][4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Tr::kDqSteps; ++kk) {
      Wgmma<T, 128>::template ss<1, 1>(dq,
                                       desc_advance(ds_desc_m, buf * Tr::kPBytes + kk * 16 * 128),
                                       desc_advance(kdq_desc, kk * 16 * 128), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < Tr::kKVSteps; ++kk) {
      Wgmma<T, 128>::template ss<0, 1>(dv, desc_advance(p_desc, buf * Tr::kPBytes + kk * 32),
                                       desc_advance(do_desc_n, s * Tr::kQBytes + kk * 16 * 128), 1);
    }
#pragma unroll
    for (int kk = 0; kk < Tr::kKVSteps; ++kk) {
      Wgmma<T, 128>::template ss<0, 1>(dk, desc_advance(ds_desc, buf * Tr::kPBytes + kk * 32),
                                       desc_advance(q_desc_n, s * Tr::kQBytes + kk * 16 * 128), 1);
    }
    wgmma_commit();
    wgmma_wait<1>();
    fence_operands(dq);

    // dQ into the workspace: chunks 2·wg and 2·wg + 1 of the query block.
    float* const chunks = p.dq_accum + ((bh * m_blocks + m) * Tr::kDqChunks + 2 * wg) * (64 * 64);
    // Deterministic mode: key blocks add into a query block in order (one turn counter per
    // warpgroup's columns); those that reach it are 0 .. its last, so this one's turn is its index.
    add_dq_in_turn(chunks, dq, p.deterministic, tp.dq_turn + (bh * m_blocks + m) * 2 + wg,
                   key_block, false, Tr::kDqBarrier + wg, ctid);
    wgmma_wait<0>();
    fence_operands(dk);
    fence_operands(dv);
    if (lane == 0) mbar_arrive(empty(s));  // this warp is done with the stage's Q and dO
  }

  // dK·scale and dV (times keep_scale) to their rows, through the Q buffers (free now: every
  // TMA load was consumed and every wgmma waited for). Row = the key (unpermuted), 16-byte
  // chunks swizzled by row; this warpgroup's columns are chunks 16·wg ...
  named_bar_sync(Tr::kConsumerBarrier, 128 * Tr::kConsumers);
  unsigned char* const out_k = smem + Tr::kOffQ;
  unsigned char* const out_v = out_k + Tr::kOutBytes;
  constexpr int kRowBytes = Tr::kHeadDim * 2;
  const float dk_scale = p.scale * ds_scale;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = 8 * g + 2 * warp + hh;
#pragma unroll
    for (int j = 0; j < kHalfDT; ++j) {
      const int off = row * kRowBytes + (((kHalfDT * wg + j) ^ (row & 7)) << 4) + 4 * t;
      *reinterpret_cast<std::uint32_t*>(out_k + off) =
          pack2<T>(dk[j][2 * hh] * dk_scale, dk[j][2 * hh + 1] * dk_scale);
      *reinterpret_cast<std::uint32_t*>(out_v + off) =
          pack2<T>(dv[j][2 * hh] * ds_scale, dv[j][2 * hh + 1] * ds_scale);
    }
  }
  named_bar_sync(Tr::kConsumerBarrier, 128 * Tr::kConsumers);
  T* const dk_rows = static_cast<T*>(p.dk) + b * p.dk_stride.b + kvh * p.dk_stride.h;
  T* const dv_rows = static_cast<T*>(p.dv) + b * p.dv_stride.b + kvh * p.dv_stride.h;
  constexpr int kRowChunks = Tr::kHeadDim / 8;
  for (int c = ctid + 128 * wg; c < kBlockN * kRowChunks; c += 128 * Tr::kConsumers) {
    const int row = c / kRowChunks, chunk = c % kRowChunks;
    const std::int64_t key = n0 + row;
    if (key >= p.Lk) continue;
    const int col = 8 * chunk;
    const int off = row * kRowBytes + ((chunk ^ (row & 7)) << 4);
    if (col < p.D) {
      *reinterpret_cast<uint4*>(dk_rows + key * p.dk_stride.l + col) =
          *reinterpret_cast<const uint4*>(out_k + off);
    }
    if (col < p.Dv) {
      *reinterpret_cast<uint4*>(dv_rows + key * p.dv_stride.l + col) =
          *reinterpret_cast<const uint4*>(out_v + off);
    }
  }
#endif
}

}  // namespace memeff::cuda::sm90
