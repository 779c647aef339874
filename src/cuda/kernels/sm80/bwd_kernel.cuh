// The sm80 backward main kernel of the fused attention (FlashAttention-2 style, mma.sync): one
// CTA per key block and (batch, kv head), dK/dV in registers, dQ and broadcast dbias by fp32
// atomics. Its preprocess and dbias conversion are common/bwd_prepost.cuh, its dQ conversion
// sm80/bwd_prepost.cuh.
//
// Main kernel orientation: every warp owns 16 keys (rows of Sᵀ = K·Qᵀ) of the CTA's key block
// and all kBlockM queries of the current query block, so dV += (P∘Z)ᵀ·dO and dK += dSᵀ·Q take their
// A operand straight from the accumulators; only dS goes through shared memory (for dQ = dS·K).
// Dropout bits are regenerated per (query block, 64-key block) with one Philox call per 16
// elements (cooperatively, into shared memory), from absolute (i, j): the map of
// src/core/dropout_map.h, so tiling cannot change the mask (PyTorch PR #103704's bug class).
//
// Packed variable-length sequences (kPacked, common/varlen.cuh): the main kernel's grid is (key
// tiles of every sequence, Hkv), each CTA finding its (sequence, key block) with the warp-scan
// scheduler over cu_seqlens_k; a sequence then reads like a dense batch entry of its own lengths
// whose rows start at its packed rows, and the fp32 workspace holds one row per (head, packed
// query row) (bwd_traits.cuh). The dense instantiation keeps compile-time zero offsets.
//
// Sliding window, ALiBi and softcap (ScoreMods in params.h, docs/window.md) run in their own
// instantiation (kMods below): a key block walks only the query blocks that see one of its keys
// (KeyMask::query_blocks), so its work follows the window; steps the window (or Lk, or the
// causal diagonal) cuts get its element mask, and rows that see a single key (by the window's
// count) get dS = 0. The score is cap(scale·q·k) + bias - slope·|i + shift - j|; dbias takes dS,
// then the cap's derivative 1 - tanh² multiplies it for dQ and dK.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/kernels/common/block_order.h"
#include "cuda/kernels/common/bwd_dbias.cuh"
#include "cuda/kernels/common/cp_async.cuh"
#include "cuda/kernels/common/dropout_frag.cuh"
#include "cuda/kernels/common/mask.cuh"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/score_modifiers.cuh"
#include "cuda/kernels/common/softmax.cuh"
#include "cuda/kernels/common/varlen.cuh"
#include "cuda/kernels/sm80/bwd_traits.cuh"
#include "cuda/kernels/sm80/mma.cuh"

namespace memeff::cuda::sm80 {

// Adds two adjacent fp32 values (8-byte aligned) to global memory: one vector reduction on sm_90.
__device__ __forceinline__ void red_add2(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// Main kernel.
//   Dense (common/block_order.h): grid (band, key blocks, B·Hkv / band), key block y (+
//   key_block_base) of b·Hkv + kvh = z·band + x (+ head_base).
//   Packed: grid.x: key tiles of all sequences (the scheduler's index), or with seq_per_cta the
//   sequence, whose key block key_block_base the CTA takes (deterministic launches); grid.y: kvh.
//   dbias_mode: none, direct (no broadcast: dS written as is) or reduced (fp32 atomics into
//   dbias_accum [dB, dH, dL, Lk], summed over query rows in the warp first when dL == 1).
struct BwdLaunchExtra {
  int key_block_base = 0;
  int head_base = 0;
  DbiasMode dbias_mode = DbiasMode::none;
  float* dbias_accum = nullptr;
  bool seq_per_cta = false;
};

// kBias: p.bias is set (a template argument, as in the forward); packed calls have none.
//
// kMods: the one instantiation per dtype and head dim for calls with a window, ALiBi or a softcap
// (p.mods.flags != 0). Its bias and packed layout follow the params at run time (kBias: a bias
// when p.bias is set; kPacked false: packed when p.cu_seqlens_q is set; dropout does in every
// instantiation), and its step computes P and dS in its own code (the kMods branch below).
template <class T, class Tr, bool kPacked, bool kBias, bool kMods = false>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    attention_backward_kernel(const BackwardParams p, const BwdLaunchExtra extra) {
  static_assert(!(kPacked && kBias), "packed calls take no bias");
  static_assert(!kMods || (kBias && !kPacked),
                "the score-modifier kernel takes a bias and packing at run time");
  // What the params switch on at run time in the modifiers' kernel (constants elsewhere).
  const bool packed_call = kPacked || (kMods && p.cu_seqlens_q != nullptr);
  const bool has_bias = kBias && (!kMods || p.bias != nullptr);
  constexpr int kHeadDim = Tr::kHeadDim, kBlockN = Tr::kBlockN, kBlockM = Tr::kBlockM,
                kRowPad = Tr::kRowPad;
  constexpr int kNT = kBlockM / 8;   // n8 tiles of queries in Sᵀ
  constexpr int kDT = kHeadDim / 8;  // n8 tiles of the head dim in dK, dV

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + kBlockN * kRowPad;
  T* sQbuf = sV + kBlockN * kRowPad;          // [2][kBlockM][kRowPad]
  T* sdObuf = sQbuf + 2 * kBlockM * kRowPad;  // [2][kBlockM][kRowPad]
  T* sdS = sdObuf + 2 * kBlockM * kRowPad;    // [kBlockN][kDsPad]
  float* sLse =
      reinterpret_cast<float*>(sdS + kBlockN * Tr::kDsPad);  // [2][kBlockM], lse (natural)
  float* sDelta = sLse + 2 * kBlockM;                        // [2][kBlockM]
  std::uint16_t* sKeep =
      reinterpret_cast<std::uint16_t*>(sDelta + 2 * kBlockM);  // [2][kb64][kBlockM][4]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  // This CTA's batch entry or sequence b, kv head and first key n0 (inside the sequence); packed,
  // `span` holds the sequence's first packed rows, lengths and causal shift (dense: its offsets
  // stay compile-time zeros).
  int b, kvh;
  std::int64_t n0;
  SeqSpan span;
  if (packed_call) {
    kvh = blockIdx.y;
    int key_block;
    if (extra.seq_per_cta) {
      b = blockIdx.x;
      key_block = extra.key_block_base;
    } else {
      // Every warp runs the scheduler (coalesced loads of the offsets) rather than one warp and
      // a barrier: all get the same answer, so the whole CTA returns together.
      const VarlenTile tile =
          varlen_tile(p.cu_seqlens_k, p.B, p.total_k, p.Lk, kBlockN, blockIdx.x);
      if (tile.seq >= p.B) return;  // past the last tile (the grid is an upper bound)
      b = tile.seq;
      key_block = tile.block;
    }
    span = seq_span(p, b);
    n0 = static_cast<std::int64_t>(key_block) * kBlockN;
    // Deterministic launches give every sequence the same key block index: one with fewer key
    // blocks has nothing here (the scheduler never gives such a block).
    if (n0 >= span.Lk) return;
  } else {
    // Plain expressions of the block index (bwd_kernel.cuh of sm90 says why).
    const int y = static_cast<int>(blockIdx.z * gridDim.x + blockIdx.x) + extra.head_base;
    b = y / p.Hkv;
    kvh = y % p.Hkv;
    const int key_block = static_cast<int>(blockIdx.y) + extra.key_block_base;
    n0 = static_cast<std::int64_t>(key_block) * kBlockN;
    if constexpr (kMods) span = seq_span(p, b);  // the batch entry's lengths, zero offsets
  }
  // References, not copies: the dense kernel then reads the params where it uses them (constant
  // bank operands) and keeps no registers for them in the main loop.
  constexpr bool kSpan = kPacked || kMods;  // lengths from `span` (the modifiers' kernel: always)
  const std::int64_t& Lq = kSpan ? span.Lq : p.Lq;
  const std::int64_t& Lk = kSpan ? span.Lk : p.Lk;
  const std::int64_t& causal_shift = kSpan ? span.causal_shift : p.causal_shift;
  // Row of query i of head h in softmax_d and dq_accum (workspace_rows).
  auto ws_row = [&](int h, std::int64_t i) -> std::int64_t {
    if (packed_call) {
      return h * p.total_q + span.q0 + i;
    } else {
      return (static_cast<std::int64_t>(b) * p.Hq + h) * p.Lq + i;
    }
  };

  // Dropout key from the values or (graph replays) from device memory.
  detail::DropoutKey rng_key{0u, 0u};
  if (p.has_dropout) {
    const std::uint64_t seed = p.seed_ptr ? *p.seed_ptr : p.seed;
    const std::uint64_t offset = p.offset_ptr ? *p.offset_ptr : p.offset;
    rng_key = detail::dropout_key(seed, offset);
  }

  // Load this CTA's K and V tiles (rows past Lk and columns past D / Dv read as zeros: packed,
  // such rows are the next sequence's).
  {
    const T* kg =
        static_cast<const T*>(p.k) + b * p.k_stride.b + kvh * p.k_stride.h + span.k0 * p.k_stride.l;
    const T* vg =
        static_cast<const T*>(p.v) + b * p.v_stride.b + kvh * p.v_stride.h + span.k0 * p.v_stride.l;
    constexpr int kChunks = kHeadDim / 8;
    for (int c = tid; c < kBlockN * kChunks; c += Tr::kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 8;
      const std::int64_t j = n0 + r;
      const bool row_ok = j < Lk;
      const std::int64_t jc = row_ok ? j : 0;
      cp_async_16(sK + r * kRowPad + col, kg + jc * p.k_stride.l + (col < p.D ? col : 0),
                  row_ok && col < p.D ? 16 : 0);
      cp_async_16(sV + r * kRowPad + col, vg + jc * p.v_stride.l + (col < p.Dv ? col : 0),
                  row_ok && col < p.Dv ? 16 : 0);
    }
    cp_async_commit();
  }

  // Query blocks this key block meets: all, or (causal) those with some i where n0 <= i + shift;
  // the window's (kMods) also end them (KeyMask::query_blocks).
  const int num_m = static_cast<int>((Lq + kBlockM - 1) / kBlockM);
  int m_begin, m_count;
  if constexpr (kMods) {
    const BlockRange range =
        KeyMask{is_causal(p), Lk, causal_shift, p.mods.left_reach, p.mods.right_reach}
            .query_blocks<kBlockM, kBlockN>(n0, num_m);
    m_begin = range.begin;
    m_count = range.count();
  } else {
    m_begin = KeyMask{is_causal(p), Lk, causal_shift}.first_query_block<kBlockM>(n0, num_m);
    m_count = num_m - m_begin;
  }
  const int items = m_count * p.group;

  // Issues the loads of item `it` into buffer `buf`: Q and dO tiles by cp.async; lse, delta and
  // the dropout keep bits by plain stores.
  auto prefetch = [&](int it, int buf) {
    const int hg = it / m_count, m = m_begin + it % m_count;
    const int h = kvh * p.group + hg;
    const std::int64_t m0 = static_cast<std::int64_t>(m) * kBlockM;
    const T* qg =
        static_cast<const T*>(p.q) + b * p.q_stride.b + h * p.q_stride.h + span.q0 * p.q_stride.l;
    const T* dog = static_cast<const T*>(p.dout) + b * p.dout_stride.b + h * p.dout_stride.h +
                   span.q0 * p.dout_stride.l;
    T* sQ = sQbuf + buf * kBlockM * kRowPad;
    T* sdO = sdObuf + buf * kBlockM * kRowPad;
    constexpr int kChunks = kHeadDim / 8;
    for (int c = tid; c < kBlockM * kChunks; c += Tr::kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 8;
      const std::int64_t i = m0 + r;
      const bool row_ok = i < Lq;
      const std::int64_t ic = row_ok ? i : 0;
      cp_async_16(sQ + r * kRowPad + col, qg + ic * p.q_stride.l + (col < p.D ? col : 0),
                  row_ok && col < p.D ? 16 : 0);
      cp_async_16(sdO + r * kRowPad + col, dog + ic * p.dout_stride.l + (col < p.Dv ? col : 0),
                  row_ok && col < p.Dv ? 16 : 0);
    }
    const std::int64_t bh = static_cast<std::int64_t>(b) * p.Hq + h;  // dropout's (b = sequence, h)
    for (int r = tid; r < kBlockM; r += Tr::kThreads) {
      const std::int64_t i = m0 + r;
      // 4-byte asynchronous copies: no thread waits here on a global load before the barrier.
      const bool row_ok = i < Lq;
      const std::int64_t ic = row_ok ? i : 0;
      cp_async_4(sLse + buf * kBlockM + r,
                 p.lse + b * p.lse_stride_b + h * p.lse_stride_h + span.q0 + ic, row_ok ? 4 : 0);
      cp_async_4(sDelta + buf * kBlockM + r, p.softmax_d + ws_row(h, ic), row_ok ? 4 : 0);
    }
    if (p.has_dropout) {
      std::uint16_t* keep = sKeep + buf * (Tr::kKeyBlocks64 * kBlockM * 4);
      for (int c = tid; c < Tr::kKeyBlocks64 * kBlockM * 4; c += Tr::kThreads) {
        const int cls = c & 3, r = (c >> 2) % kBlockM, kb = (c >> 2) / kBlockM;
        // Global coordinates (params.h): the map's row q_start + i, key block k_block64 + j / 64.
        const detail::Philox4 bits = detail::dropout_call(
            rng_key, static_cast<std::uint64_t>(bh), p.q_start + static_cast<std::uint32_t>(m0 + r),
            p.k_block64 + static_cast<std::uint32_t>(n0 / 64 + kb),
            static_cast<std::uint32_t>(cls));
        keep[c] = static_cast<std::uint16_t>(keep_bits16_fast(bits, p.keep_threshold));
      }
    }
  };

  float acc_dk[kDT][4], acc_dv[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n) {
#pragma unroll
    for (int r = 0; r < 4; ++r) acc_dk[n][r] = acc_dv[n][r] = 0.f;
  }

  const int key_row0 = warp * 16;  // this warp's keys within the block
  const std::int64_t j_lo = n0 + key_row0 + g, j_hi = j_lo + 8;
  const float keep_scale = p.keep_scale;

  if (items > 0) {
    prefetch(0, 0);
    cp_async_commit();
  }
  for (int it = 0; it < items; ++it) {
    const int buf = it & 1;
    if (it + 1 < items) prefetch(it + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const int hg = it / m_count, m = m_begin + it % m_count;
    const int h = kvh * p.group + hg;
    const std::int64_t m0 = static_cast<std::int64_t>(m) * kBlockM;
    const T* sQ = sQbuf + buf * kBlockM * kRowPad;
    const T* sdO = sdObuf + buf * kBlockM * kRowPad;
    const float* lse_row = sLse + buf * kBlockM;
    const float* delta = sDelta + buf * kBlockM;

    // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for this warp's 16 keys × kBlockM queries.
    float s[kNT][4], dp[kNT][4];
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) s[n][r] = dp[n][r] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      std::uint32_t ak[4], av[4];
      ldmatrix_x4(ak, sK + (key_row0 + (lane & 15)) * kRowPad + kk * 16 + (lane >> 4) * 8);
      ldmatrix_x4(av, sV + (key_row0 + (lane & 15)) * kRowPad + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int n = 0; n < kNT; n += 2) {
        std::uint32_t bq[4], bo[4];
        const int row = (n + (lane >> 4)) * 8 + (lane & 7);
        const int col = kk * 16 + ((lane >> 3) & 1) * 8;
        ldmatrix_x4(bq, sQ + row * kRowPad + col);
        ldmatrix_x4(bo, sdO + row * kRowPad + col);
        const std::uint32_t bq0[2] = {bq[0], bq[1]}, bq1[2] = {bq[2], bq[3]};
        const std::uint32_t bo0[2] = {bo[0], bo[1]}, bo1[2] = {bo[2], bo[3]};
        mma_16816<T>(s[n], ak, bq0);
        mma_16816<T>(s[n + 1], ak, bq1);
        mma_16816<T>(dp[n], av, bo0);
        mma_16816<T>(dp[n + 1], av, bo1);
      }
    }

    // P = exp2(S·scale·log2e + bias·log2e − lse·log2e), masked; Z from the keep bits;
    // s ← P∘Z (for dV), dp ← dS = P∘(Z∘dP − D). Key row kr = key_row0 + g + 8·hh of the block
    // (key j_lo + 8·hh) is past the end when kr >= keys_left; query column qi (query m0 + qi)
    // past Lq when qi >= rows_left. Masks in 32-bit tile-local terms: key row kr is causally
    // hidden from query qi when kr - qi > causal_lim (the plain step's).
    const bool need_mask =
        (n0 + kBlockN > Lk) || (is_causal(p) && n0 + kBlockN - 1 > m0 + causal_shift);
    const int keys_left = static_cast<int>(Lk - n0 < kBlockN ? Lk - n0 : kBlockN);
    const int rows_left = static_cast<int>(Lq - m0 < kBlockM ? Lq - m0 : kBlockM);
    const std::int64_t lim64 = is_causal(p) ? m0 + causal_shift - n0 : std::int64_t{1} << 30;
    const int causal_lim =
        static_cast<int>(lim64 > (1 << 30) ? (1 << 30) : (lim64 < -(1 << 30) ? -(1 << 30) : lim64));
    const std::uint16_t* keep = sKeep + buf * (Tr::kKeyBlocks64 * kBlockM * 4);
    const int kb64 = key_row0 / 64;
    const int byte_lo = 2 * ((key_row0 % 64) / 8) + (g & 1);  // byte of key j_lo; j_hi: +2
    const float score_limit = has_bias ? bias_score_limit(p.scale_log2) : 0.0f;
    std::int64_t bias_tile = 0;  // element offset of (m0, j_lo) in the bias
    if (has_bias)
      bias_tile = b * p.bias_stride.b + h * p.bias_stride.h + m0 * p.bias_stride.l + j_lo;
    // lse·log2e of query column qi; +inf for rows past Lq or without a visible key (lse = -inf):
    // P = 0.
    auto lse_log2 = [&](int qi) {
      const float lse = lse_row[qi];
      return (qi < rows_left && lse != -INFINITY) ? lse * kLog2e : INFINITY;
    };
    // The dropout map's keep bits of query column qi (all ones without dropout).
    auto keep_bits = [&](int qi) -> std::uint32_t {
      return p.has_dropout ? keep[(kb64 * kBlockM + qi) * 4 + (g >> 1)] : 0xFFFFu;
    };
    // bias·log2e of (query column qi, key row kr of half hh); 0 past Lq or Lk.
    auto bias_log2 = [&](int qi, int kr, int hh) {
      float bias_l2 = 0.f;
      if (has_bias && qi < rows_left && kr < keys_left) {
        const std::int64_t off = bias_tile + qi * p.bias_stride.l + 8 * hh;
        bias_l2 = (p.bias_is_fp32 ? static_cast<const float*>(p.bias)[off]
                                  : to_float(static_cast<const T*>(p.bias)[off])) *
                  kLog2e;
      }
      return bias_l2;
    };
    // Dropout's Z of key half hh from the keep bits: keep_scale or 0 (1 without dropout).
    auto dropout_z = [&](std::uint32_t kbits, int hh) {
      float z = 1.f;
      if (p.has_dropout) z = ((kbits >> (byte_lo + 2 * hh)) & 1u) ? keep_scale : 0.f;
      return z;
    };
    if constexpr (kMods) {
      // The modifiers' step: the score is cap(scale·s) + bias - slope·|i + shift - j| (each where
      // the call has it), masked by the window, the causal mask and Lk on the steps they cut
      // (window_mask), with the window's single-key rows. The thread's rows of Sᵀ are keys j_lo
      // and j_hi = j_lo + 8 (not the sm90 backward's key0, key0 + 1), its columns the queries
      // m0 + 2t + 8n + e, as the sm90 one's.
      const KeyMask mask{is_causal(p), Lk, causal_shift, p.mods.left_reach, p.mods.right_reach};
      const bool window_mask = mask.tile_needs_mask<kBlockM, kBlockN>(m0, n0);
      const bool cap = (p.mods.flags & ScoreMods::kSoftcap) != 0;
      const float slope_log2 =
          (p.mods.flags & ScoreMods::kAlibi) ? alibi_slope(p.mods, b, h) * kLog2e : 0.0f;
      // i + shift - j of element (0, 0): query m0 + 2t, key j_lo (fp32: exact below 2^24).
      const float diagonal = static_cast<float>(m0 + 2 * t + causal_shift - j_lo);
      // Columns [lo[hh], hi[hh]) (c = 8n + e) whose queries see key j_lo + 8·hh.
      int lo[2] = {0, 0}, hi[2] = {8 * kNT, 8 * kNT};
      if (window_mask) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const detail::KeySpan rows = mask.rows_of_key(j_lo + 8 * hh);
          lo[hh] = fragment_column<kNT>(rows.begin, m0, t);
          hi[hh] = fragment_column<kNT>(rows.end, m0, t);
        }
      }
      // Bit 2n + e: query column 8n + 2t + e sees a single key, so its dS is 0 (not for a key
      // block of a larger attention, where the row may see other keys; packed calls never are).
      const std::uint32_t single =
          window_mask && (packed_call || !p.kv_block) ? mask.single_key_rows<kNT>(m0 + 2 * t) : 0u;
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int qi = n * 8 + 2 * t + e, c = 8 * n + e;
          const float l2 = lse_log2(qi);
          const float dl = delta[qi];
          const std::uint32_t kbits = keep_bits(qi);
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int r = 2 * hh + e;
            // The cap of q·k in its own units (ScoreMods), and its derivative 1 - tanh².
            float sv = s[n][r], cap_grad = 1.f;
            if (cap) {
              sv = softcap_score(sv, p.mods);
              const float th = sv * p.mods.softcap_in;  // tanh(scale·s / softcap)
              cap_grad = fmaf(-th, th, 1.f);
            }
            // A -inf bias masks the key whatever the score holds (mask.cuh, bias_safe_score).
            if (has_bias) sv = bias_safe_score(sv, score_limit);
            const float x = fmaf(-slope_log2, fabsf(diagonal + static_cast<float>(c - 8 * hh)),
                                 bias_log2(qi, key_row0 + g + 8 * hh, hh) - l2);
            float pv = fast_exp2(fmaf(sv, p.scale_log2, x));
            if (c < lo[hh] || c >= hi[hh]) pv = 0.f;
            const float z = dropout_z(kbits, hh);
            const float ds = pv * (z * dp[n][r] - dl);
            dp[n][r] = (single >> (2 * n + e)) & 1u ? ds * 0.f : ds;  // NaN stays (docs/api.md)
            s[n][r] = cap ? pack_p_and_cap_grad<T>(pv * z, cap_grad) : pv * z;
          }
        }
      }
      // dbias takes dS as it is (dense calls; packed ones have no bias); then the cap's
      // derivative multiplies it and P∘Z comes back out of the words it shared with it.
      if (has_bias) {
        write_dbias<T>(p, extra.dbias_mode, extra.dbias_accum, dp, 1.0f, b, h, m0, j_lo, j_hi, t);
      }
      if (cap) {
#pragma unroll
        for (int n = 0; n < kNT; ++n)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            dp[n][r] *= cap_grad_of(s[n][r]);
            s[n][r] = p_of_packed<T>(s[n][r]);
          }
      }
    } else {
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int qi = n * 8 + 2 * t + e;
          const float l2 = lse_log2(qi);
          const float dl = delta[qi];
          const std::uint32_t kbits = keep_bits(qi);
          // Not for a key block of a larger attention (the row may see other keys there); packed
          // calls never are one (validation), and leaving the flag out keeps them from spilling.
          const bool zero_ds = need_mask && (kPacked || !p.kv_block) &&
                               sees_one_key(m0 + qi, Lk, is_causal(p), causal_shift);
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int r = 2 * hh + e;
            const int kr = key_row0 + g + 8 * hh;
            const float bias_l2 = bias_log2(qi, kr, hh);
            // A -inf bias masks the key whatever the score holds (mask.cuh, bias_safe_score).
            const float sv = has_bias ? bias_safe_score(s[n][r], score_limit) : s[n][r];
            float pv = fast_exp2(fmaf(sv, p.scale_log2, bias_l2 - l2));
            if (need_mask && (kr >= keys_left || kr - qi > causal_lim)) pv = 0.f;
            const float z = dropout_z(kbits, hh);
            s[n][r] = pv * z;
            // Times 0, not 0: a NaN or Inf stays, it is the data's, not rounding's (docs/api.md).
            const float ds = pv * (z * dp[n][r] - dl);
            dp[n][r] = zero_ds ? ds * 0.f : ds;
          }
        }
      }
    }

    // dV += (P∘Z)ᵀ·dO and dK += dSᵀ·Q (A from registers, B by transposed ldmatrix).
#pragma unroll
    for (int ks = 0; ks < kBlockM / 16; ++ks) {
      std::uint32_t ap[4], ads[4];
      c_pair_to_a<T>(ap, s[2 * ks], s[2 * ks + 1]);
      c_pair_to_a<T>(ads, dp[2 * ks], dp[2 * ks + 1]);
      const int row = ks * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
      for (int n = 0; n < kDT; n += 2) {
        const int col = n * 8 + (lane >> 4) * 8;
        std::uint32_t bo[4], bq[4];
        ldmatrix_x4_trans(bo, sdO + row * kRowPad + col);
        ldmatrix_x4_trans(bq, sQ + row * kRowPad + col);
        const std::uint32_t bo0[2] = {bo[0], bo[1]}, bo1[2] = {bo[2], bo[3]};
        const std::uint32_t bq0[2] = {bq[0], bq[1]}, bq1[2] = {bq[2], bq[3]};
        mma_16816<T>(acc_dv[n], ap, bo0);
        mma_16816<T>(acc_dv[n + 1], ap, bo1);
        mma_16816<T>(acc_dk[n], ads, bq0);
        mma_16816<T>(acc_dk[n + 1], ads, bq1);
      }
    }

    // dSᵀ to shared memory (for dQ) and dbias.
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      // element (key g, queries 2t, 2t+1) are dp[n][0], dp[n][1] with rows = keys: the smem
      // layout is [key][query], so the pair is contiguous.
      const int qc = n * 8 + 2 * t;
      *reinterpret_cast<std::uint32_t*>(sdS + (key_row0 + g) * Tr::kDsPad + qc) =
          pack2<T>(dp[n][0], dp[n][1]);
      *reinterpret_cast<std::uint32_t*>(sdS + (key_row0 + g + 8) * Tr::kDsPad + qc) =
          pack2<T>(dp[n][2], dp[n][3]);
    }
    if constexpr (!kPacked && !kMods) {  // (the modifiers' kernel wrote it above)
      write_dbias<T>(p, extra.dbias_mode, extra.dbias_accum, dp, 1.0f, b, h, m0, j_lo, j_hi, t);
    }
    __syncthreads();

    // dQ (kBlockM × kHeadDim) += dS·K: warp (wm, wn) owns 16 query rows × kDqCols columns.
    {
      constexpr int kCT = Tr::kDqCols / 8;
      const int wm = warp % Tr::kWarpsM, wn = warp / Tr::kWarpsM;
      float acc_dq[kCT][4];
#pragma unroll
      for (int n = 0; n < kCT; ++n) {
#pragma unroll
        for (int r = 0; r < 4; ++r) acc_dq[n][r] = 0.f;
      }
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        std::uint32_t a[4];
        // A(row = query, k = key) from dSᵀ [key][query] by a transposed load.
        ldmatrix_x4_trans(a, sdS + (ks * 16 + (lane & 7) + (lane >> 4) * 8) * Tr::kDsPad + wm * 16 +
                                 ((lane >> 3) & 1) * 8);
        const int krow = ks * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
        for (int n = 0; n < kCT; n += 2) {
          std::uint32_t bk[4];
          ldmatrix_x4_trans(bk, sK + krow * kRowPad + wn * Tr::kDqCols + n * 8 + (lane >> 4) * 8);
          const std::uint32_t bk0[2] = {bk[0], bk[1]}, bk1[2] = {bk[2], bk[3]};
          mma_16816<T>(acc_dq[n], a, bk0);
          mma_16816<T>(acc_dq[n + 1], a, bk1);
        }
      }
      float* dq_rows = p.dq_accum + ws_row(h, m0) * p.D;
#pragma unroll
      for (int n = 0; n < kCT; ++n) {
        const int col = wn * Tr::kDqCols + n * 8 + 2 * t;
        if (col >= p.D) continue;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = wm * 16 + g + 8 * hh;
          if (m0 + r < Lq) {  // never the next sequence's rows
            red_add2(dq_rows + static_cast<std::int64_t>(r) * p.D + col, acc_dq[n][2 * hh],
                     acc_dq[n][2 * hh + 1]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // dK = scale · Σ dSᵀ·Q, dV = Σ (P∘Z)ᵀ·dO, in the output dtype.
  T* dk = static_cast<T*>(p.dk) + b * p.dk_stride.b + kvh * p.dk_stride.h + span.k0 * p.dk_stride.l;
  T* dv = static_cast<T*>(p.dv) + b * p.dv_stride.b + kvh * p.dv_stride.h + span.k0 * p.dv_stride.l;
#pragma unroll
  for (int n = 0; n < kDT; ++n) {
    const int col = n * 8 + 2 * t;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const std::int64_t j = hh ? j_hi : j_lo;
      if (j >= Lk) continue;  // packed: the next sequence's key
      if (col < p.D) {
        *reinterpret_cast<std::uint32_t*>(dk + j * p.dk_stride.l + col) =
            pack2<T>(acc_dk[n][2 * hh] * p.scale, acc_dk[n][2 * hh + 1] * p.scale);
      }
      if (col < p.Dv) {
        *reinterpret_cast<std::uint32_t*>(dv + j * p.dv_stride.l + col) =
            pack2<T>(acc_dv[n][2 * hh], acc_dv[n][2 * hh + 1]);
      }
    }
  }
}

}  // namespace memeff::cuda::sm80
