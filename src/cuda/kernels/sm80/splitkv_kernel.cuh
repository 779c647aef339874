// The split-KV forward for few queries per head (decode, chunked prefill): the fused forward tiles
// 128 query rows of one head per CTA, so with 1-16 queries almost every MMA row is padding and
// only B·Hq CTAs run. Here one CTA owns 16 rows made of the queries of ALL query heads of one
// GQA group (row r = head-in-group r / Lq, query r % Lq), so each K/V byte is read once per kv
// head, and one range of whole 64-key blocks (a split); the splits fill the GPU. Its four warps
// share each 64-key tile (warp w: keys 16w..16w+15), keep their own online softmax and are merged
// in shared memory; the CTA writes its rows' normalized partial output (fp32) and lse to a
// workspace, and splitkv_combine_kernel merges the splits with their lse into out and lse.
//
// Semantics are the fused forward's (scale, causal both ways at the global coordinates, bias with
// broadcast strides, dropout with the documented map: warp w's 16 keys of a 64-key block are word
// w of the lane's Philox call, so the mask is the same bytes the fused kernels draw).
//
// Sliding window, ALiBi and softcap (ScoreMods, docs/window.md) run in their own instantiations
// (kMods), so calls without them keep their code. A CTA's key blocks are its split's (the plan's
// splits cover the blocks some query sees) intersected with those the queries of its row block
// see (splitkv_key_span); a CTA left with none writes its rows' empty partial (0, lse -inf), as
// a split past a causal diagonal does. Each of a lane's two rows has its own head and query, so
// the modifiers go row by row: the cap on q·k, ALiBi with the row's head's slope after the scale
// (natural units), and the row's own key span as the mask where the warp's 16 keys cross it.
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
#include "cuda/kernels/sm80/fwd_kernel.cuh"
#include "cuda/kernels/sm80/mma.cuh"
#include "cuda/kernels/sm80/splitkv.h"

namespace memeff::cuda::sm80 {

// Tile shape of the split-KV forward for head-dim bucket kHeadDim (D and Dv up to it).
template <int kHeadDim_>
struct SplitKvTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kSplitKvRows;  // rows (group heads x queries) per CTA
  static constexpr int kBlockN = 64;            // = the dropout map's key block
  static constexpr int kWarps = 4;              // warp w: keys 16w..16w+15 of each block
  static constexpr int kThreads = kWarps * 32;
  // CTAs per SM the registers are budgeted for: three fit the 68 KB of shared memory of hd128 on
  // an H100 (ptxas, sm_90a: 168 registers with dropout, no spills; four CTAs, 128 registers,
  // spilled 40 bytes at hd64 with dropout).
  static constexpr int kMinBlocks = 3;
  static constexpr int kDTiles = kHeadDim / 8;       // n8 tiles of O per row
  static constexpr int kKSteps = kHeadDim / 16;      // k16 steps of Q·Kᵀ
  static constexpr int kChunks = kHeadDim / 8;       // 16-byte chunks per smem row
  static constexpr int kSmemQ = kBlockM * kHeadDim;  // elements
  static constexpr int kSmemKV = kBlockN * kHeadDim;
  static constexpr int kSmemBytes = (kSmemQ + 4 * kSmemKV) * 2;  // Q + 2 K + 2 V buffers
  // The warps' outputs merged after the loop, in the K/V buffers: [warp][row][kHeadDim + pad].
  static constexpr int kMergeStride = kHeadDim + 4;
  static_assert(kWarps * kBlockM * kMergeStride * 4 <= 4 * kSmemKV * 2);
  static_assert(kBlockN == 16 * kWarps && kBlockM == 16 && kDTiles % 2 == 0);
};

// Programmatic dependent launch (compute capability 9.0; no-ops where compiled for an older
// target, whose launches are never chained): a grid launched chained after another waits for that
// grid's completion and memory with grid_dependency_wait; launch_dependents lets the dependent
// grid's CTAs be scheduled once every CTA of this grid has called it or exited.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// One row (half hh) of this lane: where its query comes from and what it sees.
struct SplitKvRow {
  bool valid;            // r < group·Lq
  int h;                 // query head
  std::int64_t i;        // query index
  std::int64_t j_limit;  // first key it does not see
  std::int64_t j_first;  // first key it sees (the modifiers' kernel: the window's left side)
};

// kMods: the instantiation (one per dtype, head dim and dropout) for calls with a window, ALiBi or
// a softcap (p.mods.flags != 0).
template <class T, class Tr, bool kDropout, bool kMods = false>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    splitkv_forward_kernel(const ForwardParams p, const SplitKvPlan plan) {
  constexpr int kDT = Tr::kDTiles, kHD = Tr::kHeadDim, kNT = 2;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const sQ = reinterpret_cast<T*>(smem_raw);
  T* const sK = sQ + Tr::kSmemQ;       // two buffers of kSmemKV
  T* const sV = sK + 2 * Tr::kSmemKV;  // two buffers of kSmemKV
  __shared__ float s_m[Tr::kWarps][Tr::kBlockM], s_l[Tr::kWarps][Tr::kBlockM];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  // blockIdx.x = row block + row_blocks·(split + splits·(b·Hkv + kvh)): the row blocks of one
  // split are neighbours, so they read the same K/V from L2.
  const int row_block = static_cast<int>(blockIdx.x % plan.row_blocks);
  const std::int64_t rest = blockIdx.x / plan.row_blocks;
  const int split = static_cast<int>(rest % plan.splits);
  const std::int64_t bkv = rest / plan.splits;
  const int b = static_cast<int>(bkv / p.Hkv), kvh = static_cast<int>(bkv % p.Hkv);
  const std::int64_t rows = static_cast<std::int64_t>(p.group) * p.Lq;
  const std::int64_t r0 = static_cast<std::int64_t>(row_block) * Tr::kBlockM;
  int kb_begin = split * plan.blocks_per_split;
  int kb_end = min(kb_begin + plan.blocks_per_split, plan.key_blocks);
  if constexpr (kMods) {
    // The split's blocks from the plan's first, cut to those the row block's queries see (all
    // queries where its rows wrap past a head's last query).
    kb_begin += plan.first_block;
    kb_end += plan.first_block;
    const std::int64_t r_last = min(r0 + Tr::kBlockM, rows) - 1;
    const bool one_head = r0 / p.Lq == r_last / p.Lq;
    const detail::KeySpan keys =
        splitkv_key_span(p, one_head ? r0 % p.Lq : 0, one_head ? r_last % p.Lq : p.Lq - 1);
    if (keys.size() > 0) {
      kb_begin = max(kb_begin, static_cast<int>(keys.begin / Tr::kBlockN));
      kb_end = min(kb_end, static_cast<int>((keys.end + Tr::kBlockN - 1) / Tr::kBlockN));
    } else {
      kb_end = kb_begin;
    }
  }

  const T* k = static_cast<const T*>(p.k) + b * p.k_stride.b + kvh * p.k_stride.h;
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride.b + kvh * p.v_stride.h;

  // Q: row r of the tile is query (r0 + r) % Lq of head kvh·group + (r0 + r) / Lq; rows past
  // group·Lq and columns past D load as zeros.
  for (int idx = tid; idx < Tr::kBlockM * Tr::kChunks; idx += Tr::kThreads) {
    const int row = idx / Tr::kChunks, chunk = idx % Tr::kChunks;
    const std::int64_t r = r0 + row;
    const bool valid = r < rows && chunk * 8 < p.D;
    const T* src = static_cast<const T*>(p.q);
    if (valid) {
      const int h = kvh * p.group + static_cast<int>(r / p.Lq);
      src += b * p.q_stride.b + h * p.q_stride.h + (r % p.Lq) * p.q_stride.l + chunk * 8;
    }
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     smem_addr(sQ) + row * (kHD * 2) + ((chunk ^ (row & 7)) << 4)),
                 "l"(src), "r"(valid ? 16 : 0));
  }
  const int n_tiles = kb_end - kb_begin;
  const std::int64_t key0 = static_cast<std::int64_t>(kb_begin) * Tr::kBlockN;
  if (n_tiles > 0) {
    load_tile<Tr, Tr::kBlockN>(smem_addr(sK), k + key0 * p.k_stride.l, p.k_stride.l, p.Lk - key0,
                               p.D, tid);
  }
  cp_async_commit();
  if (n_tiles > 0) {
    load_tile<Tr, Tr::kBlockN>(smem_addr(sV), v + key0 * p.v_stride.l, p.v_stride.l, p.Lk - key0,
                               p.Dv, tid);
  }
  cp_async_commit();

  // This lane's two rows (g and g + 8 of the tile).
  SplitKvRow row_of[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const std::int64_t r = r0 + g + 8 * hh;
    SplitKvRow& rw = row_of[hh];
    rw.valid = r < rows;
    rw.h = kvh * p.group + (rw.valid ? static_cast<int>(r / p.Lq) : 0);
    rw.i = rw.valid ? r % p.Lq : 0;
    if constexpr (kMods) {
      const detail::KeySpan keys = splitkv_key_span(p, rw.i, rw.i);
      rw.j_first = keys.begin;
      rw.j_limit = keys.end;
    } else {
      rw.j_first = 0;
      rw.j_limit = is_causal(p) ? min(p.Lk, rw.i + p.causal_shift + 1) : p.Lk;
    }
  }

  const bool has_bias = p.bias != nullptr;
  // Scores as in the fused forward: x = q·k (fast path) or x = scale·q·k + bias (premul, also for
  // scale <= 0 and for ALiBi, whose penalty is in natural units), exponentiated as exp2(x·f - m·f).
  const bool alibi = kMods && (p.mods.flags & ScoreMods::kAlibi) != 0;
  const bool premul = has_bias || !(p.scale > 0.0f) || alibi;
  const float f = premul ? kLog2e : p.scale_log2;
  const float m_to_natural = premul ? 1.0f : p.scale;
  detail::DropoutKey key{0, 0};
  if constexpr (kDropout) key = dropout_key_of(p);
  const KeepThreshold thr(p.keep_threshold);
  float slope[2] = {0.0f, 0.0f};  // ALiBi: each row's head's
  if (alibi) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) slope[hh] = alibi_slope(p.mods, b, row_of[hh].h);
  }

  float o[kDT][4];
#pragma unroll
  for (int d = 0; d < kDT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float row_m[2] = {-INFINITY, -INFINITY}, row_l[2] = {0.0f, 0.0f};

  // ldmatrix addresses as in the fused forward (fwd_kernel.cuh), for one m16 tile of Q and this
  // warp's 16 keys of K and V.
  const int lm_mat = lane >> 3, lm_row = lane & 7;
  constexpr int kRowBytes = kHD * 2;
  int off_a[4], off_b[4];
#pragma unroll
  for (int x = 0; x < 4; ++x) {
    off_a[x] = ((2 * x + (lm_mat >> 1)) ^ lm_row) << 4;
    off_b[x] = ((2 * x + (lm_mat & 1)) ^ lm_row) << 4;
  }
  const std::uint32_t sQ_addr = smem_addr(sQ) + ((lm_mat & 1) * 8 + lm_row) * kRowBytes;
  const std::uint32_t sK_addr =
      smem_addr(sK) + (warp * 16 + (lm_mat >> 1) * 8 + lm_row) * kRowBytes;
  const std::uint32_t sV_addr = smem_addr(sV) + (warp * 16 + (lm_mat & 1) * 8 + lm_row) * kRowBytes;

  // Tile it + 1 of K or V (keys past Lk as zeros) into the other buffer, as one cp.async group.
  auto prefetch = [&](T* smem, const T* gmem, std::int64_t stride, int cols, int it, int buf,
                      std::int64_t n0) {
    if (it + 1 < n_tiles) {
      load_tile<Tr, Tr::kBlockN>(smem_addr(smem + (buf ^ 1) * Tr::kSmemKV),
                                 gmem + (n0 + Tr::kBlockN) * stride, stride,
                                 p.Lk - n0 - Tr::kBlockN, cols, tid);
    }
    cp_async_commit();
  };

  for (int it = 0; it < n_tiles; ++it) {
    const int buf = it & 1;
    const std::int64_t n0 = key0 + static_cast<std::int64_t>(it) * Tr::kBlockN;
    const std::int64_t n0w = n0 + 16 * warp;  // this warp's first key

    cp_async_wait<1>();  // K[it] has landed
    __syncthreads();
    prefetch(sK, k, p.k_stride.l, p.D, it, buf, n0);

    // S = Q·Kᵀ for the 16 rows and this warp's 16 keys.
    float s[kNT][4] = {};
#pragma unroll
    for (int ks = 0; ks < Tr::kKSteps; ++ks) {
      // Q's fragments are re-read from shared memory each tile (in registers they cost the
      // kernel 32 more and spilled with dropout at three CTAs per SM).
      std::uint32_t qf[4], kb[4];
      ldmatrix_x4_addr(qf, sQ_addr + (ks >> 2) * 128 + off_a[ks & 3]);
      ldmatrix_x4_addr(kb, sK_addr + buf * (Tr::kSmemKV * 2) + (ks >> 2) * 128 + off_b[ks & 3]);
      const std::uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
      mma_16816<T>(s[0], qf, b0);
      mma_16816<T>(s[1], qf, b1);
    }
    if constexpr (kMods) {
      if (p.mods.flags & ScoreMods::kSoftcap) softcap_scores(s, p.mods);  // on q·k alone
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const SplitKvRow& rw = row_of[hh];
      if (has_bias) {
        const std::int64_t base =
            b * p.bias_stride.b + rw.h * p.bias_stride.h + rw.i * p.bias_stride.l;
        // A -inf bias masks the key whatever its score holds (docs/api.md): selected here.
        add_scaled_bias_row<T, kNT, true>(s, hh, p.bias, p.bias_is_fp32, base, rw.valid, n0w, t,
                                          p.Lk, p.scale);
      } else if (premul) {
#pragma unroll
        for (int n = 0; n < kNT; ++n) s[n][2 * hh] *= p.scale, s[n][2 * hh + 1] *= p.scale;
      }
      if constexpr (kMods) {
        if (alibi) add_alibi_row(s, hh, slope[hh], rw.i + p.causal_shift - n0w - 2 * t);
        if (n0w < rw.j_first || n0w + 16 > rw.j_limit) {
          mask_row_span(s, hh, rw.j_first, rw.j_limit, n0w, t);
        }
      } else {
        if (n0w + 16 > rw.j_limit) mask_row(s, hh, rw.j_limit, n0w, t);
      }
    }

    std::uint32_t pk[kNT][2];
    {
      float alpha[2], sum[2];
      online_softmax_step(s, row_m, f, alpha, sum);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        row_l[hh] = row_l[hh] * alpha[hh] + sum[hh];
#pragma unroll
        for (int n = 0; n < kNT; ++n) pk[n][hh] = pack2<T>(s[n][2 * hh], s[n][2 * hh + 1]);
      }
      rescale_rows(o, alpha);
    }
    if constexpr (kDropout) {
      // The lane's call for (row, 64-key block) covers columns of class t; this warp's two n8
      // tiles (2·warp, 2·warp + 1) are word `warp` of it (apply_keep_words' layout).
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const SplitKvRow& rw = row_of[hh];
        const std::uint64_t bh = static_cast<std::uint64_t>(b) * p.Hq + rw.h;
        const std::uint32_t qrow = p.q_start + static_cast<std::uint32_t>(rw.i);
        const detail::Philox4 r = detail::dropout_call(key, bh, qrow, p.k_block64 + kb_begin + it,
                                                       static_cast<std::uint32_t>(t));
        const std::uint32_t word = warp == 0   ? r.x[0]
                                   : warp == 1 ? r.x[1]
                                   : warp == 2 ? r.x[2]
                                               : r.x[3];
        const std::uint32_t keep = bytes_below(word, thr.t4, thr.t4_low);
        pk[0][hh] &= spread_msb(keep, 0x9988u);
        pk[1][hh] &= spread_msb(keep, 0xBBAAu);
      }
    }

    cp_async_wait<1>();  // V[it] has landed
    __syncthreads();
    prefetch(sV, v, p.v_stride.l, p.Dv, it, buf, n0);

    // O += P·V over this warp's 16 keys (one k16 step).
    const std::uint32_t a[4] = {pk[0][0], pk[0][1], pk[1][0], pk[1][1]};
#pragma unroll
    for (int dp = 0; dp < kDT / 2; ++dp) {
      std::uint32_t vb[4];
      ldmatrix_x4_trans_addr(vb,
                             sV_addr + buf * (Tr::kSmemKV * 2) + (dp >> 2) * 128 + off_a[dp & 3]);
      const std::uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
      mma_16816<T>(o[2 * dp], a, b0);
      mma_16816<T>(o[2 * dp + 1], a, b1);
    }
  }

  // The combine (launched chained) may take its SMs' free slots from here on; it reads nothing
  // before this grid has finished.
  launch_dependents();

  // Merge the four warps: M = max of their maxima, each warp's share scaled by exp2(m·f - M·f)
  // (0 for a warp that saw nothing of the row; a NaN sum or output stays NaN).
  cp_async_wait<0>();
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float l = quad_sum(row_l[hh]);
    if (t == 0) s_m[warp][g + 8 * hh] = row_m[hh], s_l[warp][g + 8 * hh] = l;
  }
  __syncthreads();  // every warp is done with sK, sV: they hold the warps' outputs now
  auto row_max = [&](int row) {
    float m = s_m[0][row];
#pragma unroll
    for (int w = 1; w < Tr::kWarps; ++w) m = fmaxf(m, s_m[w][row]);
    return m;
  };
  float* const s_o = reinterpret_cast<float*>(sK);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = g + 8 * hh;
    const float m_all = row_max(row);
    const float share = fast_exp2(row_m[hh] * f - (m_all == -INFINITY ? 0.0f : m_all * f));
    float* dst = s_o + (warp * Tr::kBlockM + row) * Tr::kMergeStride + 2 * t;
#pragma unroll
    for (int d = 0; d < kDT; ++d) {
      dst[8 * d] = o[d][2 * hh] * share;
      dst[8 * d + 1] = o[d][2 * hh + 1] * share;
    }
    // The warp's sum scaled likewise (s_l is read only after the barrier below).
    if (t == 0) s_l[warp][row] *= share;
  }
  __syncthreads();

  // The partial output of each valid row, normalized (times keep_scale), and its lse; a row
  // without a visible key in this split writes 0 and -inf, which the combine weighs 0.
  const float keep_scale = kDropout ? p.keep_scale : 1.0f;
  const std::int64_t rows_total = static_cast<std::int64_t>(p.B) * p.Hq * p.Lq;
  const int dv_quads = p.Dv / 4;
  for (int idx = tid; idx < Tr::kBlockM * dv_quads; idx += Tr::kThreads) {
    const int row = idx / dv_quads, col = 4 * (idx % dv_quads);
    const std::int64_t r = r0 + row;
    if (r >= rows) continue;
    float l = 0.0f;
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) l += s_l[w][row];
    const bool empty = l == 0.0f;  // no visible key; a NaN l stays NaN
    const float inv = keep_scale / l;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (!empty) {
#pragma unroll
      for (int w = 0; w < Tr::kWarps; ++w) {
        const float4 x = *reinterpret_cast<const float4*>(
            s_o + (w * Tr::kBlockM + row) * Tr::kMergeStride + col);
        acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
      }
      acc.x *= inv, acc.y *= inv, acc.z *= inv, acc.w *= inv;
    }
    const int h = kvh * p.group + static_cast<int>(r / p.Lq);
    const std::int64_t row_id = (static_cast<std::int64_t>(b) * p.Hq + h) * p.Lq + r % p.Lq;
    const std::int64_t slot = split * rows_total + row_id;
    *reinterpret_cast<float4*>(plan.o_partial + slot * p.Dv + col) = acc;
    if (col == 0) {
      plan.lse_partial[slot] = empty ? -INFINITY : row_max(row) * m_to_natural + logf(l);
    }
  }
}

// Merges the splits of one row of [B, Hq, Lq] per CTA: lse = log Σ exp(lse_s), out = Σ exp(lse_s
// - lse)·o_s. Thread s reads split s's lse (kSplitKvCombineThreads >= kSplitKvMaxSplits), so the
// row's maximum and sum take one load per thread and two reductions; the weights go to shared
// memory and warp w adds the partial outputs of splits w, w + 4, ... (independent loads), the
// four sums meeting in shared memory. A split without a visible key (lse_s = -inf) weighs exactly
// 0 and its output is never read; a NaN lse_s makes the row NaN; a row no split sees gives 0 and
// -inf. Launched chained after the splits' kernel (splitkv_run.cuh): it waits for that grid first.
template <class T>
__global__ void __launch_bounds__(kSplitKvCombineThreads)
    splitkv_combine_kernel(const ForwardParams p, const SplitKvPlan plan) {
  constexpr int kWarps = kSplitKvCombineThreads / 32;
  static_assert(kSplitKvCombineThreads >= kSplitKvMaxSplits && kSplitKvCombineThreads % 32 == 0);
  // What a split contributes to the row: its weight exp(lse_s - lse), or -1 where it has none.
  __shared__ float s_weight[kSplitKvMaxSplits];
  __shared__ float s_reduce[kWarps];
  __shared__ float4 s_out[kWarps][SplitKv::kLargestHeadDim / 4];
  grid_dependency_wait();  // the splits' partial outputs and lse

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const std::int64_t rows_total = static_cast<std::int64_t>(p.B) * p.Hq * p.Lq;
  const std::int64_t row_id = blockIdx.x;
  const std::int64_t bh = row_id / p.Lq, i = row_id % p.Lq;
  const int b = static_cast<int>(bh / p.Hq), h = static_cast<int>(bh % p.Hq);

  const float x = tid < plan.splits ? plan.lse_partial[tid * rows_total + row_id] : -INFINITY;
  // The row's maximum (NaN if any split's lse is NaN: fmaxf would drop it, so it is counted).
  float m = x;
  int nan = x != x;
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, d));
    nan |= __shfl_xor_sync(0xFFFFFFFFu, nan, d);
  }
  if (lane == 0) s_reduce[warp] = nan ? NAN : m;
  __syncthreads();
  m = -INFINITY;
  bool row_nan = false;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    row_nan |= s_reduce[w] != s_reduce[w];
    m = fmaxf(m, s_reduce[w]);
  }
  const bool seen = !row_nan && m != -INFINITY;
  float e = seen ? expf(x - m) : 0.0f;  // exp(-inf) = 0
  float total = e;
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) total += __shfl_xor_sync(0xFFFFFFFFu, total, d);
  __syncthreads();  // every thread has read s_reduce's maxima
  if (lane == 0) s_reduce[warp] = total;
  __syncthreads();
  total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += s_reduce[w];
  if (tid < kSplitKvMaxSplits) s_weight[tid] = x == -INFINITY ? -1.0f : e * (1.0f / total);
  __syncthreads();

  // Warp w's share of the columns' sums: lane l holds columns 4l .. 4l + 3 (Dv <= 128).
  const int col = 4 * lane;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (seen && total > 0.0f && col < p.Dv) {
#pragma unroll 4
    for (int s = warp; s < plan.splits; s += kWarps) {
      const float w = s_weight[s];
      if (w < 0.0f) continue;
      const float4 y =
          *reinterpret_cast<const float4*>(plan.o_partial + (s * rows_total + row_id) * p.Dv + col);
      acc.x = fmaf(w, y.x, acc.x);
      acc.y = fmaf(w, y.y, acc.y);
      acc.z = fmaf(w, y.z, acc.z);
      acc.w = fmaf(w, y.w, acc.w);
    }
  }
  s_out[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && col < p.Dv) {
    // row_nan: every column NaN; no visible key: 0 (no split was read).
    const float fill = row_nan ? NAN : 0.0f;
    float4 sum = make_float4(fill, fill, fill, fill);
    if (seen && total > 0.0f) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float4 y = s_out[w][lane];
        sum.x += y.x, sum.y += y.y, sum.z += y.z, sum.w += y.w;
      }
    }
    T* out = static_cast<T*>(p.out) + b * p.out_stride.b + h * p.out_stride.h + i * p.out_stride.l;
    *reinterpret_cast<uint2*>(out + col) =
        make_uint2(pack2<T>(sum.x, sum.y), pack2<T>(sum.z, sum.w));
  }
  if (tid == 0) {
    float* lse = p.lse + b * p.lse_stride_b + h * p.lse_stride_h + i;
    *lse = row_nan ? NAN : total > 0.0f ? m + logf(total) : -INFINITY;
  }
}

}  // namespace memeff::cuda::sm80
