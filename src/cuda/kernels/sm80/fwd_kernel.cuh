// The sm80 fused attention forward kernel (FlashAttention-2 style, mma.sync m16n8k16): one thread
// block owns kBlockM query rows of one (batch, head); K/V tiles of 64 keys stream through
// double-buffered, XOR-swizzled shared memory; softmax is online in registers; dropout is applied
// to the packed P fragment with the bytes of the shared map (core/dropout_map.h: one Philox call
// per row per 64 keys per lane, the S orientation of dropout_frag.cuh) before P·V.
//
// Packed variable-length sequences (kPacked, common/varlen.cuh): the grid is (query tiles of
// every sequence, Hq) and a CTA finds its (sequence, query block) with the warp-scan scheduler;
// all addressing is then that of a dense batch entry of the sequence's lengths whose rows start
// at its packed rows. The dense instantiation keeps compile-time zero offsets and reads the
// lengths from the params where it uses them, so packed support costs it nothing.
//
// Sliding window, ALiBi and softcap (ScoreMods in params.h, docs/window.md) run in their own
// instantiations (kMods below), so the others keep their code: a CTA visits only the key tiles
// some row of its block sees (KeyMask::key_tile_range), so its work follows the window, not Lk;
// the cap replaces q·k before the scale and the bias, ALiBi's -slope·|i + shift - j| follows them
// in natural units, and tiles the window (or Lk, or the causal diagonal) cuts get the window's
// element mask (score_modifiers.cuh), the others none.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/dropout_map.h"
#include "cuda/kernels/common/cp_async.cuh"
#include "cuda/kernels/common/dropout_frag.cuh"
#include "cuda/kernels/common/mask.cuh"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/score_modifiers.cuh"
#include "cuda/kernels/common/softmax.cuh"
#include "cuda/kernels/common/varlen.cuh"
#include "cuda/kernels/sm80/fwd_traits.cuh"
#include "cuda/kernels/sm80/mma.cuh"

namespace memeff::cuda::sm80 {

// Element offset of (row, 16-byte chunk) in a tile with kHeadDim columns: chunks are XORed with
// row % 8, so the 8 rows an ldmatrix phase reads hit 8 different bank groups.
template <int kHeadDim>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * kHeadDim + ((chunk ^ (row & 7)) << 3);
}

// Copies rows [0, kRows) x columns [0, kHeadDim) of a tile with cp.async; rows >= rows_valid
// and columns >= cols_valid are zero-filled (cols_valid is a multiple of 8). Each thread owns one
// chunk column and every kRowsPerIter-th row, so its swizzle is fixed and its source pointer
// advances by one running add per row (nothing for the compiler to hoist into registers).
template <class Tr, int kRows, class T>
__device__ __forceinline__ void load_tile(std::uint32_t smem_tile, const T* gmem,
                                          std::int64_t row_stride, std::int64_t rows_valid,
                                          int cols_valid, int tid) {
  constexpr int kRowsPerIter = Tr::kThreads / Tr::kChunks;
  static_assert(Tr::kThreads % Tr::kChunks == 0 && kRowsPerIter % 8 == 0 &&
                kRows % kRowsPerIter == 0);
  const int chunk = tid % Tr::kChunks, row0 = tid / Tr::kChunks;
  const bool col_ok = chunk * 8 < cols_valid;
  const std::int64_t rem = rows_valid - row0;
  const T* src = gmem + row0 * row_stride + chunk * 8;
  const std::int64_t step = kRowsPerIter * row_stride;
  const std::uint32_t dst = smem_tile + row0 * (Tr::kHeadDim * 2) + ((chunk ^ (row0 & 7)) << 4);
#pragma unroll
  for (int it = 0; it < kRows / kRowsPerIter; ++it) {
    const bool valid = col_ok && it * kRowsPerIter < rem;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     dst + it * kRowsPerIter * (Tr::kHeadDim * 2)),
                 "l"(valid ? src : gmem), "r"(valid ? 16 : 0));
    src += step;
  }
}

// ldmatrix on a precomputed 32-bit shared-memory address (immediates fold into the instruction).
__device__ __forceinline__ void ldmatrix_x4_addr(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans_addr(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// kBias: p.bias is set (a template argument, so the kernels without a bias carry none of its
// registers or its rare NaN fix-up); packed calls have none.
//
// kMods: the instantiation (one per dtype, head dim and dropout) for calls with a window, ALiBi
// or a softcap (p.mods.flags != 0). Its bias and packed layout follow the params at run time
// (kBias: a bias when p.bias is set; kPacked false: packed when p.cu_seqlens_q is set), so the
// build grows by two kernels per dtype and head dim rather than one per combination.
template <class T, class Tr, bool kDropout, bool kPacked, bool kBias, bool kMods = false>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    attention_forward_kernel(const ForwardParams p) {
  static_assert(!(kPacked && kBias), "packed calls take no bias");
  static_assert(!kMods || (kBias && !kPacked),
                "the score-modifier kernel takes a bias and packing at run time");
  // What the params switch on at run time in the modifiers' kernel (constants elsewhere).
  const bool packed_call = kPacked || (kMods && p.cu_seqlens_q != nullptr);
  const bool has_bias = kBias && (!kMods || p.bias != nullptr);
  constexpr int kMT = Tr::kMTiles, kNT = Tr::kNTiles, kDT = Tr::kDTiles, kHD = Tr::kHeadDim;
  constexpr float kNegInf = -INFINITY;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const sQ = reinterpret_cast<T*>(smem_raw);
  T* const sK = sQ + Tr::kSmemQ;       // two buffers of kSmemKV
  T* const sV = sK + 2 * Tr::kSmemKV;  // two buffers of kSmemKV

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  // This CTA's batch entry or sequence b, head h and first query row m0 (inside the sequence);
  // packed, `span` holds the sequence's first packed rows, lengths and causal shift (dense: its
  // offsets stay compile-time zeros).
  int b, h, kvh;
  std::int64_t m0;
  std::int64_t bh;  // the dropout map's (b, h): batch entry or sequence b (docs/dropout.md)
  SeqSpan span;
  if (packed_call) {
    // Every warp runs the scheduler (a few coalesced loads of the offsets) rather than one warp
    // and a barrier: the answer is the same in all of them, so the whole CTA returns together.
    const VarlenTile tile =
        varlen_tile(p.cu_seqlens_q, p.B, p.total_q, p.Lq, Tr::kBlockM, blockIdx.x);
    if (tile.seq >= p.B) return;  // past the last tile (the grid is an upper bound)
    b = tile.seq;
    h = blockIdx.y;
    kvh = h / p.group;
    bh = static_cast<std::int64_t>(b) * p.Hq + h;
    span = seq_span(p, b);
    // Heaviest query blocks of a sequence (most keys under a causal mask) first.
    const int blocks = static_cast<int>((span.Lq + Tr::kBlockM - 1) / Tr::kBlockM);
    m0 = static_cast<std::int64_t>(blocks - 1 - tile.block) * Tr::kBlockM;
  } else {
    const int bh_dense = blockIdx.x;
    bh = bh_dense;
    b = bh_dense / p.Hq;
    h = bh_dense % p.Hq;
    kvh = h / p.group;
    // Heaviest query blocks (most keys under a causal mask) are scheduled first.
    m0 = static_cast<std::int64_t>(gridDim.y - 1 - blockIdx.y) * Tr::kBlockM;
    if constexpr (kMods) span = seq_span(p, b);  // the batch entry's lengths, zero offsets
  }
  // References, not copies: the dense kernel then reads the params where it uses them (constant
  // bank operands) and keeps no registers for them in the main loop.
  constexpr bool kSpan = kPacked || kMods;  // lengths from `span` (the modifiers' kernel: always)
  const std::int64_t& Lq = kSpan ? span.Lq : p.Lq;
  const std::int64_t& Lk = kSpan ? span.Lk : p.Lk;
  const std::int64_t& causal_shift = kSpan ? span.causal_shift : p.causal_shift;

  const T* q = static_cast<const T*>(p.q) + b * p.q_stride.b + h * p.q_stride.h +
               (span.q0 + m0) * p.q_stride.l;
  const T* k =
      static_cast<const T*>(p.k) + b * p.k_stride.b + kvh * p.k_stride.h + span.k0 * p.k_stride.l;
  const T* v =
      static_cast<const T*>(p.v) + b * p.v_stride.b + kvh * p.v_stride.h + span.k0 * p.v_stride.l;

  // Key tiles [n_first, n_first + n_tiles): from 0 but in the modifiers' kernel, where the
  // window's left side also skips the tiles before the first key the block sees.
  int n_first = 0, n_tiles;
  if constexpr (kMods) {
    const BlockRange tiles =
        KeyMask{is_causal(p), Lk, causal_shift, p.mods.left_reach, p.mods.right_reach}
            .key_tile_range<Tr::kBlockM, Tr::kBlockN>(m0);
    n_first = tiles.begin;
    n_tiles = tiles.count();
  } else {
    n_tiles = KeyMask{is_causal(p), Lk, causal_shift}.key_tiles<Tr::kBlockM, Tr::kBlockN>(m0);
  }
  const std::int64_t first_key = static_cast<std::int64_t>(n_first) * Tr::kBlockN;

  // Prologue: groups {Q, K0} and {V0}. Rows past the sequence's lengths load as zeros (packed:
  // they belong to the next sequence) and keys past Lk are masked below.
  load_tile<Tr, Tr::kBlockM>(smem_addr(sQ), q, p.q_stride.l, Lq - m0, p.D, tid);
  if (n_tiles > 0) {
    load_tile<Tr, Tr::kBlockN>(smem_addr(sK), k + first_key * p.k_stride.l, p.k_stride.l,
                               Lk - first_key, p.D, tid);
  }
  cp_async_commit();
  if (n_tiles > 0) {
    load_tile<Tr, Tr::kBlockN>(smem_addr(sV), v + first_key * p.v_stride.l, p.v_stride.l,
                               Lk - first_key, p.Dv, tid);
  }
  cp_async_commit();

  // Scores are kept as x = q·k (fast path) or x = scale·q·k + bias (premul) and exponentiated as
  // exp2(x·f - m·f): f folds the scale and log2(e). premul also covers scale <= 0, where the
  // maximum of q·k is not the maximum of the scores, and ALiBi, whose penalty is in natural
  // units. A softcap keeps the units (ScoreMods).
  const bool alibi = kMods && (p.mods.flags & ScoreMods::kAlibi) != 0;
  const bool premul = has_bias || !(p.scale > 0.0f) || alibi;
  const float f = premul ? kLog2e : p.scale_log2;
  const float m_to_natural = premul ? 1.0f : p.scale;

  detail::DropoutKey key{0, 0};
  if constexpr (kDropout) {
    const std::uint64_t seed = p.seed_ptr ? *p.seed_ptr : p.seed;
    const std::uint64_t offset = p.offset_ptr ? *p.offset_ptr : p.offset;
    key = detail::dropout_key(seed, offset);
  }
  const KeepThreshold thr(p.keep_threshold);  // used with dropout (threshold < 256)

  const int warp_row0 = warp * Tr::kRowsPerWarp;  // first row of this warp in the block
  const float slope = alibi ? alibi_slope(p.mods, b, h) : 0.0f;

  float o[kMT][kDT][4];
  float row_m[kMT][2], row_l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int d = 0; d < kDT; ++d) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.0f;
    row_m[mt][0] = row_m[mt][1] = kNegInf;
    row_l[mt][0] = row_l[mt][1] = 0.0f;
  }

  // ldmatrix row addresses: lane L feeds row L % 8 of matrix L / 8. Every row a lane addresses
  // is congruent to lm_row mod 8, so its swizzled chunk is 8·(c / 8) + ((c % 8) ^ lm_row): one
  // base address per tile plus four per-thread chunk offsets (xor_lo / xor_hi below, for the
  // chunk parities of the two operand patterns) and compile-time immediates.
  const int lm_mat = lane >> 3, lm_row = lane & 7;
  constexpr int kRowBytes = kHD * 2;
  // Byte offset of chunk 2x + c (x in 0..3) within its 8-chunk group, swizzled by lm_row.
  auto chunk_off = [&](int x, int c) { return (((2 * x + c) ^ lm_row) << 4); };
  int off_a[4], off_b[4];  // c = lm_mat >> 1 (Q, V) and c = lm_mat & 1 (K)
#pragma unroll
  for (int x = 0; x < 4; ++x) {
    off_a[x] = chunk_off(x, lm_mat >> 1);
    off_b[x] = chunk_off(x, lm_mat & 1);
  }
  const std::uint32_t sQ_addr = smem_addr(sQ) + (warp_row0 + (lm_mat & 1) * 8 + lm_row) * kRowBytes;
  const std::uint32_t sK_addr = smem_addr(sK) + ((lm_mat >> 1) * 8 + lm_row) * kRowBytes;
  const std::uint32_t sV_addr = smem_addr(sV) + ((lm_mat & 1) * 8 + lm_row) * kRowBytes;
  auto load_q_frag = [&](std::uint32_t(&a)[4], int mt, int ks) {
    ldmatrix_x4_addr(a, sQ_addr + mt * 16 * kRowBytes + (ks >> 2) * 128 + off_a[ks & 3]);
  };
  std::uint32_t qf[Tr::kQInRegs ? kMT : 1][Tr::kQInRegs ? Tr::kKSteps : 1][4];
  if constexpr (Tr::kQInRegs) {
    cp_async_wait<1>();
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int ks = 0; ks < Tr::kKSteps; ++ks) load_q_frag(qf[mt][ks], mt, ks);
  }

  for (int it = 0; it < n_tiles; ++it) {
    const int buf = it & 1;
    const std::int64_t n0 = static_cast<std::int64_t>(n_first + it) * Tr::kBlockN;

    cp_async_wait<1>();  // K[it] has landed (V[it] may still be in flight)
    __syncthreads();     // ... for every thread; and everyone is done with buffers buf ^ 1
    if (it + 1 < n_tiles) {
      load_tile<Tr, Tr::kBlockN>(smem_addr(sK + (buf ^ 1) * Tr::kSmemKV),
                                 k + (n0 + Tr::kBlockN) * p.k_stride.l, p.k_stride.l,
                                 Lk - n0 - Tr::kBlockN, p.D, tid);
    }
    cp_async_commit();

    // S = Q·Kᵀ for this warp's rows and the tile's 64 keys.
    float s[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int n = 0; n < kNT; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < Tr::kKSteps; ++ks) {
      std::uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (Tr::kQInRegs) {
#pragma unroll
          for (int r = 0; r < 4; ++r) a[mt][r] = qf[mt][ks][r];
        } else {
          load_q_frag(a[mt], mt, ks);
        }
      }
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        std::uint32_t kb[4];
        ldmatrix_x4_addr(kb, sK_addr + buf * (Tr::kSmemKV * 2) + np * 16 * kRowBytes +
                                 (ks >> 2) * 128 + off_b[ks & 3]);
        const std::uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<T>(s[mt][2 * np], a[mt], b0);
          mma_16816<T>(s[mt][2 * np + 1], a[mt], b1);
        }
      }
    }

    // The cap takes q·k alone (Gemma-2), in its own units (ScoreMods); then the bias, ALiBi, and
    // the mask (past Lk, causal, the window) on the tiles that need it.
    if constexpr (kMods) {
      if (p.mods.flags & ScoreMods::kSoftcap) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) softcap_scores(s[mt], p.mods);
      }
    }
    if (has_bias) {
      const std::int64_t bias_base = b * p.bias_stride.b + h * p.bias_stride.h;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        add_scaled_bias<T>(s[mt], p.bias, p.bias_is_fp32, bias_base, p.bias_stride.l,
                           m0 + warp_row0 + mt * 16 + g, n0, t, Lq, Lk, p.scale);
      }
    } else if (premul) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int n = 0; n < kNT; ++n)
#pragma unroll
          for (int r = 0; r < 4; ++r) s[mt][n][r] *= p.scale;
    }
    if constexpr (kMods) {
      if (alibi) {  // premul: natural units
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          add_alibi(s[mt], slope, m0 + warp_row0 + mt * 16 + g + causal_shift - n0 - 2 * t);
        }
      }
      const KeyMask mask{is_causal(p), Lk, causal_shift, p.mods.left_reach, p.mods.right_reach};
      if (mask.tile_needs_mask<Tr::kBlockM, Tr::kBlockN>(m0, n0)) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mask_scores_window(s[mt], m0 + warp_row0 + mt * 16 + g, n0, t, mask);
        }
      }
    } else {
      const bool need_mask =
          n0 + Tr::kBlockN > Lk || (is_causal(p) && n0 + Tr::kBlockN - 1 > m0 + causal_shift);
      if (need_mask) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mask_scores(s[mt], m0 + warp_row0 + mt * 16 + g, n0, t, Lk, is_causal(p), causal_shift);
        }
      }
    }

    // Online softmax: new row maxima, rescale O and the partial row sums, P = exp2(x·f - m·f),
    // packed to 16-bit pairs (pk[mt][n][hh] = row g + 8·hh, columns 8n + 2t + 0/1).
    std::uint32_t pk[kMT][kNT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      float alpha[2], sum[2];
      online_softmax_step(s[mt], row_m[mt], f, alpha, sum);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        row_l[mt][hh] = row_l[mt][hh] * alpha[hh] + sum[hh];
#pragma unroll
        for (int n = 0; n < kNT; ++n)
          pk[mt][n][hh] = pack2<T>(s[mt][n][2 * hh], s[mt][n][2 * hh + 1]);
      }
      rescale_rows(o[mt], alpha);
      if constexpr (kDropout) {
        // The row sums above used the undropped P; kept values get keep_scale at the end.
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          // Global coordinates (params.h): the map's row q_start + i and key block k_block64 +
          // n_first + it (this tile's).
          const std::uint32_t row =
              p.q_start + static_cast<std::uint32_t>(m0 + warp_row0 + mt * 16 + g + 8 * hh);
          const detail::Philox4 r =
              detail::dropout_call(key, static_cast<std::uint64_t>(bh), row,
                                   p.k_block64 + static_cast<std::uint32_t>(n_first + it),
                                   static_cast<std::uint32_t>(t));
          drop_packed(pk[mt], 0, hh, r, thr);
        }
      }
    }

    cp_async_wait<1>();  // V[it] has landed (K[it + 1] may still be in flight)
    __syncthreads();
    if (it + 1 < n_tiles) {
      load_tile<Tr, Tr::kBlockN>(smem_addr(sV + (buf ^ 1) * Tr::kSmemKV),
                                 v + (n0 + Tr::kBlockN) * p.v_stride.l, p.v_stride.l,
                                 Lk - n0 - Tr::kBlockN, p.Dv, tid);
    }
    cp_async_commit();

    // O += P·V: P's C fragments are A fragments of the next product (16 keys per k step).
#pragma unroll
    for (int ks = 0; ks < Tr::kBlockN / 16; ++ks) {
      std::uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        a[mt][0] = pk[mt][2 * ks][0];
        a[mt][1] = pk[mt][2 * ks][1];
        a[mt][2] = pk[mt][2 * ks + 1][0];
        a[mt][3] = pk[mt][2 * ks + 1][1];
      }
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        std::uint32_t vb[4];
        ldmatrix_x4_trans_addr(vb, sV_addr + buf * (Tr::kSmemKV * 2) + ks * 16 * kRowBytes +
                                       (dp >> 2) * 128 + off_a[dp & 3]);
        const std::uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<T>(o[mt][2 * dp], a[mt], b0);
          mma_16816<T>(o[mt][2 * dp + 1], a[mt], b1);
        }
      }
    }
  }

  // Epilogue: O / l (times keep_scale), lse = m + ln l in natural units; empty rows give 0, -inf.
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with sQ, sK, sV: sQ becomes the output staging tile
  const float keep_scale = kDropout ? p.keep_scale : 1.0f;
  float* lse_row = p.lse + b * p.lse_stride_b + h * p.lse_stride_h + span.q0;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float l = row_l[mt][hh];
      l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
      l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
      const int row = warp_row0 + mt * 16 + g + 8 * hh;
      const bool empty = l == 0.0f;  // no visible key; a NaN l (NaN scores) stays NaN
      const float inv = empty ? 0.0f : keep_scale / l;
      if (t == 0 && m0 + row < Lq) {
        lse_row[m0 + row] = empty ? kNegInf : row_m[mt][hh] * m_to_natural + logf(l);
      }
#pragma unroll
      for (int d = 0; d < kDT; ++d) {
        const std::uint32_t packed = pack2<T>(o[mt][d][2 * hh] * inv, o[mt][d][2 * hh + 1] * inv);
        *reinterpret_cast<std::uint32_t*>(sQ + swz<kHD>(row, d) + 2 * t) = packed;
      }
    }
  __syncthreads();
  T* out = static_cast<T*>(p.out) + b * p.out_stride.b + h * p.out_stride.h +
           (span.q0 + m0) * p.out_stride.l;
  constexpr int kIters = Tr::kBlockM * Tr::kChunks / Tr::kThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int idx = it * Tr::kThreads + tid;
    const int row = idx / Tr::kChunks, chunk = idx % Tr::kChunks;
    if (m0 + row < Lq && chunk * 8 < p.Dv) {  // never the next sequence's rows
      *reinterpret_cast<uint4*>(out + row * p.out_stride.l + chunk * 8) =
          *reinterpret_cast<const uint4*>(sQ + swz<kHD>(row, chunk));
    }
  }
}

}  // namespace memeff::cuda::sm80
