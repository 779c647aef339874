// The consumers of the sm90 forward (fwd_kernel.cuh): warpgroups 1..kConsumers, each owning 64
// query rows of every work item. Per item, the mainloop over its key tiles in ping-pong turns
// (S = Q·Kᵀ, softcap, scale, bias, ALiBi, mask, online softmax, dropout, O += P·V), then the
// epilogue (O / l and the log-sum-exp, stored from the registers).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dropout_map.h"
#include "cuda/kernels/common/dropout_frag.cuh"
#include "cuda/kernels/common/mask.cuh"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/score_modifiers.cuh"
#include "cuda/kernels/common/softmax.cuh"
#include "cuda/kernels/common/types.cuh"
#include "cuda/kernels/sm90/fwd_scheduler.cuh"
#include "cuda/kernels/sm90/fwd_smem.cuh"
#include "cuda/kernels/sm90/fwd_traits.cuh"
#include "cuda/kernels/sm90/fwd_variant.cuh"
#include "cuda/kernels/sm90/ptx.cuh"
#include "cuda/kernels/sm90/wgmma_ops.cuh"

namespace memeff::cuda::sm90 {

// s = scale·s + bias for a thread's two rows of a score fragment, the bias tile as TMA left it
// in shared memory (BiasRead::tiles): boxes of 64 keys by kBlockM rows, each row 128 bytes whose
// 16-byte chunk c sits at chunk c ^ (row % 8) (the 128-byte swizzle). The thread's rows are
// `row` and row + 8 of the block (both ≡ g mod 8), its keys 8n + 2t and 8n + 2t + 1 of n8 tile n:
// one 4-byte load per row and n8 tile, and the 32 lanes of a warp hit 32 different banks. Rows
// past Lq and keys past Lk were zero-filled: they add 0, as add_scaled_bias does.
template <class T, int kNT>
__device__ __forceinline__ void add_tiled_bias(float (&s)[kNT][4], const unsigned char* tile,
                                               int box_bytes, int row, int t, float scale) {
  const int swizzle = row & 7;
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
    const unsigned char* lo =
        tile + (n / 8) * box_bytes + row * 128 + (((n % 8) ^ swizzle) << 4) + 4 * t;
    const std::uint32_t a = *reinterpret_cast<const std::uint32_t*>(lo);
    const std::uint32_t b = *reinterpret_cast<const std::uint32_t*>(lo + 8 * 128);
    s[n][0] = fmaf(s[n][0], scale, unpack_lo<T>(a));
    s[n][1] = fmaf(s[n][1], scale, unpack_hi<T>(a));
    s[n][2] = fmaf(s[n][2], scale, unpack_lo<T>(b));
    s[n][3] = fmaf(s[n][3], scale, unpack_hi<T>(b));
  }
}

// Ping-pong turns: per work item each consumer issues its products n_tiles + 1 times (the first
// Q·Kᵀ, then Q·Kᵀ + P·V per further tile, then the last P·V), waiting for its turn on its own
// barrier and passing it to the next consumer after each. The last consumer opens the CTA's first
// turn, so consumer 0's barrier gets one arrival more than it has turns; consumer 0 takes it
// after the walk (close), and every barrier sees as many arrivals as waits. (Passing after every
// turn needs no knowledge of later items, which a dynamic walk does not have.)
template <class Tr>
struct PingPongTurns {
  static constexpr bool kPingPong = Tr::kConsumers > 1;
  static constexpr int kLastConsumer = Tr::kConsumers - 1;
  int cw;  // the consumer

  __device__ __forceinline__ void open() const {
    if constexpr (kPingPong) {
      if (cw == kLastConsumer) named_bar_arrive(Tr::kTurnBarrier, 256);
    }
  }
  __device__ __forceinline__ void begin() const {
    if constexpr (kPingPong) named_bar_sync(Tr::kTurnBarrier + cw, 256);
  }
  __device__ __forceinline__ void end() const {
    if constexpr (kPingPong) named_bar_arrive(Tr::kTurnBarrier + (cw + 1) % Tr::kConsumers, 256);
  }
  __device__ __forceinline__ void close() const {
    if constexpr (kPingPong) {
      if (cw == 0) named_bar_sync(Tr::kTurnBarrier, 256);
    }
  }
};

// Thread `tid` of consumer warpgroup `warpgroup` (1..kConsumers) through the CTA's work items,
// after the kernel's setmaxnreg_inc. The kernel's run-time switches (has_bias_at_run_time,
// dropout_on_at_run_time) are read only where the instantiation leaves them to the params
// (V::kRuntimeDropout); elsewhere has_bias and dropout_on are the constants the code they guard
// folds away with, as in the kernel.
//
// The mainloop, its steps (lambdas over the thread's state) and the epilogue stay in this one
// function. Moved out, they changed the SASS though not the work (CUDA 13.0, sm_90a): the
// epilogue as a function or a lambda kept the PTX's instructions but numbered its registers
// otherwise, and ptxas assigned registers differently in every kernel (same instruction counts,
// registers and spills); the tile mask as a function turned a branch into a predicate (head dim
// 256 with a key-padding bias and dropout: 16 more instructions, spills 32/84 -> 36/108 bytes).
template <class V>
__device__ __forceinline__ void consume_forward_items(
    const ForwardTmaParams& tp, const ForwardSmem<V>& smem, const ForwardScheduler<V>& scheduler,
    bool has_bias_at_run_time, bool dropout_on_at_run_time, int warpgroup, int tid) {
  using T = typename V::T;
  using Tr = typename V::Tr;
  constexpr int kNT = Tr::kNT, kDT = Tr::kDT, kStages = Tr::kStages, kBlockN = Tr::kBlockN;
  constexpr int kQStages = V::kQStages;
  constexpr bool kDropout = V::kDropout, kMods = V::kMods, kBiasTiles = V::kBiasTiles;
  constexpr bool kWindowCode = V::kWindowCode;
  const ForwardParams& p = tp.p;
  const bool packed_call = V::kPacked || (kMods && scheduler.packed_call);
  const bool has_bias = V::kRuntimeDropout ? has_bias_at_run_time : V::kBias;
  const bool dropout_on = V::kRuntimeDropout ? dropout_on_at_run_time : kDropout;
  // The CTA's work items (ForwardScheduler), from copies of the scheduler's values. The code
  // below reads the problem's values wherever a packed call reads the sequence's
  // (packed_call ? packed.x : p.x).
  const PackedItem& packed = scheduler.packed;
  const int m_blocks = scheduler.m_blocks;
  auto item_at = [&](int index) {
    return ForwardScheduler<V>::item_of(packed_call, packed, p, m_blocks, tp.head_band, index);
  };
  float* const key_bias_smem = smem.key_bias();

  const int cw = warpgroup - 1;            // consumer index: query rows 64·cw .. 64·cw + 63
  const int ctid = tid - 128 * warpgroup;  // thread within the warpgroup
  const int warp = ctid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

  // Scores are kept as x = q·k (fast path) or x = scale·q·k + bias (premul) and exponentiated as
  // exp2(x·f - m·f); premul also covers scale <= 0, where max q·k is not the max score, and
  // ALiBi, whose penalty is in natural units. A softcap keeps the units (ScoreMods).
  const bool premul =
      has_bias || !(p.scale > 0.0f) || (kMods && (p.mods.flags & ScoreMods::kAlibi) != 0);
  const float f = premul ? kLog2e : p.scale_log2;
  const float m_to_natural = premul ? 1.0f : p.scale;
  // The sequence's diagonal, keys and queries (dense: the problem's, the lengths read from the
  // params where used: local copies would hold more registers through the main loop).
  const std::int64_t causal_shift = packed_call ? packed.causal_shift : p.causal_shift;
  auto seq_Lk = [&]() -> std::int64_t { return packed_call ? packed.Lk : p.Lk; };
  auto seq_Lq = [&]() -> std::int64_t { return packed_call ? packed.Lq : p.Lq; };

  detail::DropoutKey key{0, 0};
  if (dropout_on) {
    const std::uint64_t seed = p.seed_ptr ? *p.seed_ptr : p.seed;
    const std::uint64_t offset = p.offset_ptr ? *p.offset_ptr : p.offset;
    key = detail::dropout_key(seed, offset);
  }
  const KeepThreshold thr(p.keep_threshold);

  // Operand descriptors: Q rows of this warpgroup (A, K-major), K tile (B, K-major), V tile
  // (B, N-major). Steps and stages move only the start address.
  const std::uint64_t q_desc = smem_desc_sw128(smem.sQ + cw * 64 * 128, 16, 1024);
  const std::uint64_t k_desc = smem_desc_sw128(smem.sK, 16, 1024);
  const std::uint64_t v_desc = smem_desc_sw128(smem.sV, Tr::kKVBlockBytes, 1024);

  int q_base = 0;  // the current item's Q buffer, as a byte offset from sQ
  auto issue_qk = [&](float(&s)[kNT][4], int stage) {
#pragma unroll
    for (int ks = 0; ks < Tr::kQKSteps; ++ks) {
      const std::uint32_t q_off = q_base + (ks / 4) * Tr::kQBlockBytes + (ks % 4) * 32;
      const std::uint32_t k_off =
          stage * Tr::kKVBytes + (ks / 4) * Tr::kKVBlockBytes + (ks % 4) * 32;
      Wgmma<T, kBlockN>::template ss<0, 0>(s, desc_advance(q_desc, q_off),
                                           desc_advance(k_desc, k_off), ks > 0 ? 1 : 0);
    }
  };
  float o[kDT][4];
  std::uint32_t pf[Tr::kPVSteps][4];  // P as wgmma A fragments (16 keys per step)
  auto issue_pv = [&](int stage) {
#pragma unroll
    for (int kk = 0; kk < Tr::kPVSteps; ++kk) {
      Wgmma<T, Tr::kHeadDim>::template rs<1>(
          o, pf[kk], desc_advance(v_desc, stage * Tr::kKVBytes + kk * 16 * 128), 1);
    }
  };

  // The current work item, as the lambdas below see it.
  int bh = 0, b = 0, h = 0;       // b: the batch entry, or the sequence when packed
  std::int64_t m0 = 0, row0 = 0;  // row0: this thread's rows are row0 and row0 + 8
  std::int64_t bias_base = 0;
  float s[kNT][4];
  float row_m[2] = {-INFINITY, -INFINITY}, row_l[2] = {0.0f, 0.0f};

  // A bias broadcast over queries (a key-padding mask: stride 0 over rows; BiasRead::keys) is
  // staged: each key tile's entries go to shared memory once per warpgroup, loaded one tile
  // ahead (thread ctid holds key ctid of the next tile while this one runs), and the softmax
  // reads two floats per n8 tile there instead of four global loads. BiasRead::global reads
  // every entry from global memory.
  constexpr bool key_bias = V::kBiasRead == BiasRead::keys;
  constexpr int kKeyBiasPer = (kBlockN + 127) / 128;  // entries per thread per tile
  float* const my_key_bias = key_bias_smem + cw * 2 * kBlockN;
  float key_bias_next[kKeyBiasPer];
  int key_bias_buf = 0;  // the buffer the current tile reads
  auto load_key_bias = [&](int n) {
#pragma unroll
    for (int q = 0; q < kKeyBiasPer; ++q) {
      const int c = ctid + 128 * q;
      const std::int64_t j = static_cast<std::int64_t>(n) * kBlockN + c;
      key_bias_next[q] =
          c < kBlockN && j < p.Lk ? load_bias<T>(p.bias, p.bias_is_fp32, bias_base + j) : 0.0f;
    }
  };
  // Into the other buffer, which every thread of the warpgroup left before the last of these
  // barriers; then it is the current one.
  auto store_key_bias = [&] {
    float* const dst = my_key_bias + (key_bias_buf ^ 1) * kBlockN;
#pragma unroll
    for (int q = 0; q < kKeyBiasPer; ++q) {
      if (ctid + 128 * q < kBlockN) dst[ctid + 128 * q] = key_bias_next[q];
    }
    named_bar_sync(Tr::kKeyBiasBarrier + cw, 128);
    key_bias_buf ^= 1;
  };

  // A bias that varies over queries, 16-bit and describable by TMA (BiasRead::tiles), arrives
  // with K in stage `stage` of the bias ring: this warpgroup's 64 rows of it are read from there,
  // two entries per load (add_tiled_bias), and the stage is released once every warp has read.
  // The thread's rows in the block: 64·cw + 16·warp + g and 8 more.
  const int block_row = 64 * cw + 16 * warp + g;
  const unsigned char* const bias_tiles = smem.bias_tiles();

  // Softcap, scale, bias, ALiBi, mask and the online softmax of the tile of key block n (ring
  // stage `stage`, ring position kv_at) in s. The modifiers' kernel tests each of them on
  // p.mods.flags; the others the window alone, once per tile (the same for the whole CTA).
  auto softmax_tile = [&](int n, int stage, int kv_at, float(&alpha)[2]) {
    const std::int64_t n0 = static_cast<std::int64_t>(n) * kBlockN;
    if constexpr (kMods) {  // the cap takes q·k alone (Gemma-2), in its own units (ScoreMods)
      if (p.mods.flags & ScoreMods::kSoftcap) softcap_scores(s, p.mods);
    }
    if (has_bias) {
      if constexpr (key_bias) {
        add_staged_key_bias(s, my_key_bias + key_bias_buf * kBlockN, t, row0 < p.Lq,
                            row0 + 8 < p.Lq, p.scale);
      } else if constexpr (kBiasTiles) {
        mbar_wait(smem.b_full(stage), (kv_at / kStages) & 1);
        add_tiled_bias<T>(s, bias_tiles + stage * Tr::kBiasTileBytes, Tr::kBiasBoxBytes, block_row,
                          t, p.scale);
        __syncwarp();
        if (lane == 0) mbar_arrive(smem.b_empty(stage));
      } else {
        add_scaled_bias<T>(s, p.bias, p.bias_is_fp32, bias_base, p.bias_stride.l, row0, n0, t, p.Lq,
                           p.Lk, p.scale);
      }
    } else if (premul) {
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) s[j][r] *= p.scale;
    }
    if constexpr (kMods) {
      if (p.mods.flags & ScoreMods::kAlibi) {  // premul: natural units
        add_alibi(s, alibi_slope(p.mods, b, h), row0 + causal_shift - n0 - 2 * t);
      }
    }
    if (kWindowCode && (p.mods.flags & ScoreMods::kWindow)) {
      const KeyMask mask{is_causal(p), seq_Lk(), causal_shift, p.mods.left_reach,
                         p.mods.right_reach};
      if (mask.tile_needs_mask<Tr::kBlockM, kBlockN>(m0, n0)) {
        mask_scores_window(s, row0, n0, t, mask);
      }
    } else {
      const bool need_mask =
          n0 + kBlockN > seq_Lk() || (is_causal(p) && n0 + kBlockN - 1 > m0 + causal_shift);
      if (need_mask) mask_scores(s, row0, n0, t, seq_Lk(), is_causal(p), causal_shift);
    }
    float sum[2];
    online_softmax_step(s, row_m, f, alpha, sum);
    row_l[0] = row_l[0] * alpha[0] + sum[0];
    row_l[1] = row_l[1] * alpha[1] + sum[1];
  };
  // Dropout keep words of the tile of key block n (coordinates only). The first tile's are
  // drawn while its Q·Kᵀ runs; each later tile's before the warpgroup waits for its turn to
  // issue, so the rounds run while the other warpgroup issues and the turn's issue sequence
  // stays short (measured on the H100 against drawing them after the issues: +8-9% forward
  // TFLOP/s with dropout at head dim 128, within 1% at 64). The modifiers' kernel without
  // dropout keeps every element (words of ones: no Philox calls).
  constexpr int kDropBlocks = kDropout ? kBlockN / 64 : 0;
  std::uint32_t keep[kDropout ? kDropBlocks : 1][2][4];
  auto draw_keep = [&](int n) {
#pragma unroll
    for (int c = 0; c < kDropBlocks; ++c)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        if (!dropout_on) {
#pragma unroll
          for (int w = 0; w < 4; ++w) keep[c][hh][w] = ~0u;
          continue;
        }
        // Global coordinates (params.h): row q_start + i, key block k_block64 + j / 64.
        const detail::Philox4 r =
            detail::dropout_call(key, static_cast<std::uint64_t>(bh),
                                 p.q_start + static_cast<std::uint32_t>(row0 + 8 * hh),
                                 p.k_block64 + static_cast<std::uint32_t>(n * kDropBlocks + c),
                                 static_cast<std::uint32_t>(t));
        keep_words(r, thr, keep[c][hh]);
      }
  };
  // P to wgmma A fragments; dropout then clears the dropped probabilities (the row sums took
  // them; kept ones get keep_scale at the end).
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < Tr::kPVSteps; ++kk) {
      pf[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      pf[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      pf[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pf[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
    if constexpr (kDropout) {
      // pf[kk][2·e + hh] is n8 tile 2·kk + e of row half hh: the [kNT][2] order of the helpers.
      auto& pk = reinterpret_cast<std::uint32_t(&)[kNT][2]>(pf);
#pragma unroll
      for (int c = 0; c < kDropBlocks; ++c)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) apply_keep_words(pk, c, hh, keep[c][hh]);
    }
  };

  // Ping-pong turns (PingPongTurns): the last consumer opens the CTA's first.
  const PingPongTurns<Tr> turn{cw};
  turn.open();

  int kv = 0;  // K/V tiles consumed so far: the ring position
  // The dynamic walk: the last item taken and the next slot's value as read ahead.
  const bool walk = scheduler.dynamic();
  int taken = -1, ahead = walk ? scheduler.peek(0) : 0;
  for (int local = 0, counted = scheduler.first_item();; ++local) {
    // The item whose Q buffer qs holds, or the end of the walk.
    const int qs = local % kQStages;
    int index = counted;
    if (walk) {
      index = scheduler.item_after(qs, ahead, taken);
      if (index == ForwardScheduler<V>::kEndOfWalk) break;
      taken = index;
      mbar_wait(smem.q_full(qs), (local / kQStages) & 1);
    } else {
      mbar_wait(smem.q_full(qs), (local / kQStages) & 1);
      if (index == ForwardScheduler<V>::kEndOfWalk) break;
    }
    counted = scheduler.counted_next(index);
    const WorkItem w = item_at(index);
    const int n_tiles = w.n_tiles;
    // Tiles are visited from the last to the first: tile n_first + n_tiles - 1 - it.
    const int n_first = kWindowCode ? w.n_first : 0;
    b = w.bh / p.Hq;
    h = w.bh % p.Hq;
    bh = w.bh;
    m0 = w.m0;
    row0 = m0 + 64 * cw + 16 * warp + g;
    if (has_bias) bias_base = b * p.bias_stride.b + h * p.bias_stride.h;

#pragma unroll
    for (int d = 0; d < kDT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    row_m[0] = row_m[1] = -INFINITY;
    row_l[0] = row_l[1] = 0.0f;

    q_base = qs * Tr::kQBytes;
    if (n_tiles > 0) {
      if constexpr (key_bias) {  // the first tile's entries, before its products
        load_key_bias(n_first + n_tiles - 1);
        store_key_bias();
      }
      {  // the first tile (key block n_first + n_tiles - 1): Q·Kᵀ alone
        const int stage = kv % kStages;
        float alpha[2];
        turn.begin();
        mbar_wait(smem.k_full(stage), (kv / kStages) & 1);
        wgmma_fence();
        issue_qk(s, stage);
        wgmma_commit();
        turn.end();
        if constexpr (kDropout) draw_keep(n_first + n_tiles - 1);
        if (key_bias && n_tiles > 1) load_key_bias(n_first + n_tiles - 2);
        wgmma_wait<0>();
        fence_operands(s);
        if (lane == 0) mbar_arrive(smem.k_empty(stage));
        softmax_tile(n_first + n_tiles - 1, stage, kv,
                     alpha);  // O is still zero: nothing to rescale
        if (key_bias && n_tiles > 1) store_key_bias();
        pack_p();
      }
      for (int it = 1; it < n_tiles; ++it) {
        const int stage = (kv + it) % kStages, prev = (kv + it - 1) % kStages;
        const std::uint32_t phase = ((kv + it) / kStages) & 1;
        const std::uint32_t prev_phase = ((kv + it - 1) / kStages) & 1;
        float alpha[2];
        if constexpr (kDropout) draw_keep(n_first + n_tiles - 1 - it);
        turn.begin();
        mbar_wait(smem.k_full(stage), phase);
        mbar_wait(smem.v_full(prev),
                  prev_phase);  // V of the previous tile was loaded before this K
        wgmma_fence();
        issue_qk(s, stage);
        wgmma_commit();
        issue_pv(prev);
        wgmma_commit();
        turn.end();
        if (key_bias && it + 1 < n_tiles) load_key_bias(n_first + n_tiles - 2 - it);
        wgmma_wait<1>();  // Q·Kᵀ done; P·V of the previous tile may still run
        fence_operands(s);
        if (lane == 0) mbar_arrive(smem.k_empty(stage));
        softmax_tile(n_first + n_tiles - 1 - it, stage, kv + it, alpha);
        if (key_bias && it + 1 < n_tiles) store_key_bias();
        wgmma_wait<0>();
        fence_operands(o);
        if (lane == 0) mbar_arrive(smem.v_empty(prev));
        rescale_rows(o, alpha);
        pack_p();
      }
      {  // the last P·V
        const int last = (kv + n_tiles - 1) % kStages;
        turn.begin();
        mbar_wait(smem.v_full(last), ((kv + n_tiles - 1) / kStages) & 1);
        wgmma_fence();
        issue_pv(last);
        wgmma_commit();
        turn.end();
        wgmma_wait<0>();
        fence_operands(o);
        if (lane == 0) mbar_arrive(smem.v_empty(last));
      }
    }
    kv += n_tiles;
    // This warp's products are done with Q, and all its lanes with the item's slot, which the
    // producer rewrites once every warp has arrived (so no lane can read the next item early).
    __syncwarp();
    if (lane == 0) mbar_arrive(smem.q_empty(qs));
    // The next item's slot, read now so the load is in flight during the epilogue.
    if (walk) ahead = scheduler.peek((local + 1) % kQStages);

    // ---------------- epilogue ----------------
    // O / l (times keep_scale), lse = m + ln l in natural units; rows that saw no key give 0, -inf.
    const float keep_scale = dropout_on ? p.keep_scale : 1.0f;
    // Packed: b strides are 0 and the sequence's rows start at its first packed row.
    const std::int64_t q0 = packed_call ? packed.q0 : 0;
    float* lse_row = p.lse + b * p.lse_stride_b + h * p.lse_stride_h + q0;
    float inv[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float l = quad_sum(row_l[hh]);
      const bool empty = l == 0.0f;  // no visible key; a NaN l (NaN scores) stays NaN
      inv[hh] = empty ? 0.0f : keep_scale / l;
      const std::int64_t i = row0 + 8 * hh;
      if (t == 0 && i < seq_Lq())
        lse_row[i] = empty ? -INFINITY : row_m[hh] * m_to_natural + logf(l);
    }
    // Straight from the accumulators: a quad writes 16 contiguous bytes of a row per n8 tile, and
    // L2 merges the halves of each 32-byte sector before they reach memory.
    T* out = static_cast<T*>(p.out) + b * p.out_stride.b + h * p.out_stride.h + q0 * p.out_stride.l;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const std::int64_t i = row0 + 8 * hh;
      if (i >= seq_Lq()) continue;
      T* out_row = out + i * p.out_stride.l + 2 * t;
#pragma unroll
      for (int j = 0; j < kDT; ++j) {
        if (8 * j < p.Dv) {
          *reinterpret_cast<std::uint32_t*>(out_row + 8 * j) =
              pack2<T>(o[j][2 * hh] * inv[hh], o[j][2 * hh + 1] * inv[hh]);
        }
      }
    }
  }
  turn.close();  // the last consumer's pass after the CTA's last turn
}

}  // namespace memeff::cuda::sm90
