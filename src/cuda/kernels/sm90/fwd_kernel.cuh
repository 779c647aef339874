// The sm90 (Hopper, sm_90a) fused attention forward: warp-specialized, TMA-fed, wgmma-based and
// persistent.
//
// The grid holds one CTA per SM; each walks the work items (a query block of kBlockM =
// 64·kConsumers rows of one batch·head) blockIdx.x, blockIdx.x + gridDim.x, ... Warpgroup 0 is the
// producer: after shrinking its registers (setmaxnreg) one thread issues every TMA load: an item's
// Q once its buffer is free (two buffers at head dim 64, so the next item's Q arrives while the
// consumers still run the current one; one elsewhere, where it arrives while they finish it:
// fwd_traits.cuh), then K and V tiles of kBlockN keys into a kStages-deep ring of shared-memory
// buffers that runs on across items, each completing on its "full" mbarrier and refilled once the
// consumers arrive on its "empty" one. Warpgroups 1..kConsumers are consumers, each owning 64
// query rows: S = Q·Kᵀ on wgmma with both operands in shared memory, the online softmax in
// registers (src/cuda/kernels/common/softmax.cuh), and O += P·V on wgmma with P from registers;
// O / l is stored from the registers.
//
// Dropout: the keep-bits of a tile depend on coordinates alone, so each consumer draws them (one
// Philox call per row per 64 keys per lane: the S orientation of
// src/cuda/kernels/common/dropout_frag.cuh, the documented map, so the mask is the reference's bit
// for bit) before it waits for its turn to issue the tile's Q·Kᵀ (the first tile's right after
// issuing it), while it would otherwise wait, and clears the dropped probabilities in its packed
// P with two byte-permutes per four elements.
//
// Overlap: inside a warpgroup, the Q·Kᵀ of tile it+1 and the P·V of tile it are issued together
// and the softmax of tile it+1 runs while P·V is still on the tensor cores; across warpgroups,
// named barriers hand the tensor cores from one consumer to the next in turn (ping-pong), so one
// warpgroup's softmax runs under another's products. Key tiles are visited from the last to the
// first, so the tiles that need masking (the causal diagonal, the end of the sequence) come first.
// Work items of one batch·head are adjacent in the persistent order, so the CTAs resident at a
// time share a few heads' K and V in L2; under a causal mask (one CTA per item) in bands of a few
// heads, each walked query block by query block, heaviest first (common/block_order.h).
//
// Sliding window, ALiBi and softcap (ScoreMods in params.h, docs/window.md): an item visits only
// the key tiles some row of its block sees (KeyMask::key_tile_range: [n_first, n_first + n_tiles)),
// so its work follows the window, not Lk; tiles the window cuts get the window's element mask
// (score_modifiers.cuh), the others none. The packed instantiations and those of a key-padding
// bias or bias tiles have the window behind one test of p.mods.flags per tile, taken by the whole
// CTA; a dense call without a bias and with a window takes the modifiers' kernels (kMods below),
// so the plain ones keep the code they had before windows. ALiBi and the softcap live in the
// modifiers' kernels: the cap replaces q·k before anything else, ALiBi's -slope·|i + shift - j|
// is added after the bias.
//
// Bias (kBiasRead, fwd_traits.cuh): a 16-bit bias that varies over queries comes as tiles of the
// block's rows by the key tile's keys, loaded by the producer right after each K tile into a ring
// of its own (full/empty barriers per stage, as K and V), so the softmax reads it from shared
// memory (add_tiled_bias); a key-padding bias (broadcast over queries) is staged by the consumers
// one key tile ahead; an fp32 bias, or one whose strides TMA cannot describe, is read per score
// from global memory.
//
// Packed sequences (kPacked, params.h: cu_seqlens_q/k): one CTA per work item, never persistent
// (an item's cost follows its sequence's key count, so the hardware's hand-out balances them as
// it does causal items); CTA x takes head x / packed_tiles and tile x % packed_tiles of the
// varlen tile scheduler over the query blocks (src/cuda/kernels/common/varlen.cuh), so a sequence
// gets one CTA per query block and no CTA waits on another sequence's length. Rows, masks and the
// dropout map are those of the sequence (b = s, positions inside it); the TMA maps describe the
// packed tensors as [1, H, total, D] and boxes start at the sequence's first row plus the block's:
// key rows past the sequence's end are the next sequence's, masked by index, and query rows past
// it are computed but never stored (the epilogue's stores are predicated per row).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/dropout_map.h"
#include "cuda/kernels/common/block_order.h"
#include "cuda/kernels/common/dropout_frag.cuh"
#include "cuda/kernels/common/mask.cuh"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/score_modifiers.cuh"
#include "cuda/kernels/common/softmax.cuh"
#include "cuda/kernels/common/types.cuh"
#include "cuda/kernels/common/varlen.cuh"
#include "cuda/kernels/sm90/fwd_traits.cuh"
#include "cuda/kernels/sm90/ptx.cuh"
#include "cuda/kernels/sm90/wgmma_ops.cuh"

namespace memeff::cuda::sm90 {

// One work item: batch·head, first query row, and the key tiles any of its rows sees:
// n_tiles of them from n_first (a window skips those before; the causal mask and the window
// those after).
struct WorkItem {
  int bh = 0;
  std::int64_t m0 = 0;
  int n_tiles = 0, n_first = 0;
};

// The key tiles query block m0 sees, in a work item: with the call's window (KeyMask) in the
// instantiations that have its code (kWindow), from key tile 0 in the others.
template <class Tr, bool kWindow>
__device__ __forceinline__ void set_key_tiles(WorkItem& w, const ForwardParams& p, std::int64_t Lk,
                                              std::int64_t shift) {
  if constexpr (kWindow) {
    const BlockRange tiles = KeyMask{is_causal(p), Lk, shift, p.mods.left_reach, p.mods.right_reach}
                                 .key_tile_range<Tr::kBlockM, Tr::kBlockN>(w.m0);
    w.n_tiles = tiles.count();
    w.n_first = tiles.begin;
  } else {
    w.n_tiles = KeyMask{is_causal(p), Lk, shift}.key_tiles<Tr::kBlockM, Tr::kBlockN>(w.m0);
  }
}

template <class Tr, bool kWindow>
__device__ __forceinline__ WorkItem work_item(const ForwardParams& p, int m_blocks, int head_band,
                                              int index) {
  const GridBlock<int> block = banded_block<int>(index, m_blocks, head_band);
  WorkItem w;
  w.bh = block.head;
  w.m0 = static_cast<std::int64_t>(m_blocks - 1 - block.position) * Tr::kBlockM;
  set_key_tiles<Tr, kWindow>(w, p, p.Lk, p.causal_shift);
  return w;
}

// A packed call's work item with its sequence. Plain members only: it crosses the CTA through a
// __shared__ variable.
struct PackedItem {
  int valid;                    // 0: the CTA's tile is past the last one of its head (it exits)
  int h, bh, n_tiles, n_first;  // bh = sequence·Hq + h: the dropout map's (b, h) with b = s
  std::int64_t m0;              // first query row of the block, inside the sequence
  std::int64_t q0, k0, Lq, Lk, causal_shift;  // the sequence (SeqSpan)
};

// The CTA's item: CTA x takes head x / tiles and tile x % tiles of the scheduler over
// cu_seqlens_q; the query blocks of a sequence are visited from the last to the first, as a dense
// head's are. Warp 0 runs the scheduler's scan, thread 0 shares the result, every thread of the
// CTA returns it. A CTA-wide barrier: call it from all threads, before the roles split.
template <class Tr>
__device__ __forceinline__ PackedItem packed_item_of_cta(const ForwardParams& p, int tiles) {
  // (Packed calls take no bias: every instantiation that runs them has the window's code.)
  __shared__ PackedItem slot;
  if (threadIdx.x < 32) {
    PackedItem it{};
    const int index = static_cast<int>(blockIdx.x), h = index / tiles;
    const VarlenTile tile =
        varlen_tile(p.cu_seqlens_q, p.B, p.total_q, p.Lq, Tr::kBlockM, index - h * tiles);
    if (tile.seq < p.B) {
      const SeqSpan span = seq_span(p, tile.seq);
      const std::int64_t m_blocks = (span.Lq + Tr::kBlockM - 1) / Tr::kBlockM;
      it.valid = 1;
      it.h = h;
      it.bh = tile.seq * p.Hq + h;
      it.m0 = (m_blocks - 1 - tile.block) * Tr::kBlockM;
      WorkItem w;
      w.m0 = it.m0;
      set_key_tiles<Tr, true>(w, p, span.Lk, span.causal_shift);
      it.n_tiles = w.n_tiles;
      it.n_first = w.n_first;
      it.q0 = span.q0;
      it.k0 = span.k0;
      it.Lq = span.Lq;
      it.Lk = span.Lk;
      it.causal_shift = span.causal_shift;
    }
    if (threadIdx.x == 0) slot = it;
  }
  __syncthreads();
  return slot;
}

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

// kBiasRead: how the bias is read (fwd_traits.cuh): per score from global memory, a key-padding
// bias staged per key tile by the consumers (key_bias below), or 16-bit tiles the producer loads
// by TMA beside K and V (bias_tiles below).
//
// kMods: the instantiations with ALiBi and the softcap (ScoreMods), for calls that have either, and
// for dense windowed calls without a bias or with one of BiasRead::global. Three per dtype and
// head dim: with a bias
// (kDropout and a global kBiasRead), whose dropout and bias follow the params at run time (a bias
// when p.bias is set), and two without one (BiasRead::none), dropout fixed by kDropout, which keep
// the registers of the run-time checks for the scores (measured: the general kernel spills at head
// dim 128 and runs 20-30% slower than the plain one with ALiBi alone; docs/benchmarks.md). All of
// them take packed calls at run time (kPacked false); the cap is one test of p.mods.flags per
// tile. The packed instantiations and those of a key-padding bias or bias tiles take the window
// alone, behind one test of p.mods.flags per tile.
template <class T, class Tr, bool kDropout, BiasRead kBiasRead, bool kPacked, bool kMods = false>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    attention_forward_kernel(const __grid_constant__ ForwardTmaParams tp) {
  constexpr bool kBias = kBiasRead != BiasRead::none;
  [[maybe_unused]] constexpr bool kBiasTiles = kBiasRead == BiasRead::tiles;
  static_assert(!(kPacked && kBias), "packed calls take no bias");
  static_assert(!kMods || (!kPacked && (kBiasRead == BiasRead::none ||
                                        (kDropout && kBiasRead == BiasRead::global))),
                "the score-modifier kernels take packing (and, with a bias, dropout) at run time");
  // The modifiers' kernel with a bias: dropout and the bias as the params say.
  [[maybe_unused]] constexpr bool kRuntimeDropout = kMods && kBias;
  // Instantiations with the window's code: the modifiers' kernels, the packed ones and those of a
  // key-padding bias and bias tiles. The dense ones without a bias have none (on the H100 their
  // window test cost calls without a window 1-4%; fwd_run.cuh sends windows to the modifiers').
  [[maybe_unused]] constexpr bool kWindowCode =
      kMods || kPacked || kBiasRead == BiasRead::keys || kBiasRead == BiasRead::tiles;
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Compiled for another target (sm_80): wgmma and setmaxnreg exist only in sm_90a, and the
  // launcher runs this kernel on compute capability 9.0 alone.
  __trap();
#else
  constexpr int kNT = Tr::kNT, kDT = Tr::kDT, kStages = Tr::kStages, kBlockN = Tr::kBlockN;
  constexpr int kLastConsumer = Tr::kConsumers - 1;
  const ForwardParams& p = tp.p;
  // What the params switch on at run time in the modifiers' kernel (constants elsewhere).
  const bool packed_call = kPacked || (kMods && p.cu_seqlens_q != nullptr);
  const bool has_bias = kBias && (!kMods || p.bias != nullptr);
  const bool dropout_on = kDropout && (!kRuntimeDropout || p.has_dropout);

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const std::uint32_t sQ = (smem_addr(smem_raw) + 1023u) & ~1023u;
  constexpr int kQStages = Tr::template q_stages<kBiasRead>();
  const std::uint32_t sK = sQ + kQStages * Tr::kQBytes;  // kStages buffers of kKVBytes
  const std::uint32_t sV = sK + kStages * Tr::kKVBytes;  // kStages buffers of kKVBytes
  const std::uint32_t sB = sV + kStages * Tr::kKVBytes;  // kBiasTiles: kStages bias tiles
  const std::uint32_t bars = sB + (kBiasTiles ? kStages * Tr::kBiasTileBytes : 0);
  // Work item `local` of the CTA uses Q buffer local % kQStages, in phase (local / kQStages) & 1.
  auto q_full = [&](int s) { return bars + 8u * s; };
  auto q_empty = [&](int s) { return bars + 8u * (kQStages + s); };
  constexpr int kQBars = 2 * kQStages;
  auto k_full = [&](int s) { return bars + 8u * (kQBars + s); };
  auto k_empty = [&](int s) { return bars + 8u * (kQBars + kStages + s); };
  auto v_full = [&](int s) { return bars + 8u * (kQBars + 2 * kStages + s); };
  auto v_empty = [&](int s) { return bars + 8u * (kQBars + 3 * kStages + s); };
  auto b_full = [&](int s) { return bars + 8u * (kQBars + 4 * kStages + s); };
  auto b_empty = [&](int s) { return bars + 8u * (kQBars + 5 * kStages + s); };
  // Then the staged key-bias tiles (Tr::kKeyBiasBytes, BiasRead::keys): two of kBlockN floats
  // per consumer.
  float* const key_bias_smem = reinterpret_cast<float*>(
      smem_raw + (bars + 8u * Tr::template barriers<kBiasRead>() - smem_addr(smem_raw)));

  const int tid = threadIdx.x;
  // Broadcast from lane 0 so the compiler knows the role is warp-uniform (wgmma in a path it
  // cannot prove uniform gets serialized).
  const int warpgroup = __shfl_sync(0xFFFFFFFFu, tid / 128, 0);
  // Work items: dense calls walk m_blocks·B·Hq of them (the launcher bounds the count by
  // 2^31 - 1) from blockIdx.x in steps of gridDim.x. A packed CTA has its one item, index 0 (an
  // extra CTA-wide barrier); one past its head's last tile leaves at once, every thread, before
  // any barrier is set up. The dense code below reads the problem's values wherever a packed call
  // reads the sequence's (packed_call ? packed.x : p.x).
  [[maybe_unused]] PackedItem packed{};
  if (packed_call) {
    packed = packed_item_of_cta<Tr>(p, tp.packed_tiles);
    if (!packed.valid) return;
  }
  const int m_blocks = packed_call ? 0 : static_cast<int>((p.Lq + Tr::kBlockM - 1) / Tr::kBlockM);
  const int items = packed_call ? 1 : m_blocks * p.B * p.Hq;
  const int first_item = packed_call ? 0 : static_cast<int>(blockIdx.x);
  const int stride = packed_call ? 1 : static_cast<int>(gridDim.x);

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kQStages; ++s) {
      mbar_init(q_full(s), 1);
      mbar_init(q_empty(s), 4 * Tr::kConsumers);  // one arrival per consumer warp
    }
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), 4 * Tr::kConsumers);
      mbar_init(v_empty(s), 4 * Tr::kConsumers);
      if constexpr (kBiasTiles) {
        mbar_init(b_full(s), 1);
        mbar_init(b_empty(s), 4 * Tr::kConsumers);
      }
    }
    fence_barrier_init();
  }
  __syncthreads();  // the last CTA-wide barrier: the producer's idle warps leave below

  auto item_at = [&](int index) {
    return packed_call ? WorkItem{packed.bh, packed.m0, packed.n_tiles, packed.n_first}
                       : work_item<Tr, kWindowCode>(p, m_blocks, tp.head_band, index);
  };

  if (warpgroup == 0) {
    // ---------------- producer ----------------
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0) {
      prefetch_tensor_map(&tp.q);
      prefetch_tensor_map(&tp.k);
      prefetch_tensor_map(&tp.v);
      if constexpr (kBiasTiles) prefetch_tensor_map(&tp.bias);
      int kv = 0;  // K/V tiles loaded so far: the ring position
      int local = 0;
      for (int index = first_item; index < items; index += stride, ++local) {
        const WorkItem w = item_at(index);
        // Map coordinates: dense (b, h, row); packed (0, h, packed row), the sequence's first
        // query and key rows added (int32: total rows are at most 2^31 - 1).
        const int b = packed_call ? 0 : w.bh / p.Hq, h = packed_call ? packed.h : w.bh % p.Hq;
        const int kvh = h / p.group;
        const int k_row0 = packed_call ? static_cast<int>(packed.k0) : 0;
        // The consumers are done with the Q this buffer held (kQStages items ago).
        const int qs = local % kQStages;
        mbar_wait(q_empty(qs), ((local / kQStages) & 1) ^ 1);
        mbar_arrive_expect_tx(q_full(qs), Tr::kQBytes);
        const int q_row = static_cast<int>(w.m0 + (packed_call ? packed.q0 : 0));
#pragma unroll
        for (int db = 0; db < Tr::kDBlocks; ++db) {
          tma_load_4d(sQ + qs * Tr::kQBytes + db * Tr::kQBlockBytes, &tp.q, q_full(qs), 64 * db,
                      q_row, h, b);
        }
        for (int it = 0; it < w.n_tiles; ++it, ++kv) {
          const int n_first = kWindowCode ? w.n_first : 0;
          const int row = k_row0 + (n_first + w.n_tiles - 1 - it) * kBlockN, s = kv % kStages;
          const std::uint32_t phase = (kv / kStages) & 1;
          mbar_wait(k_empty(s), phase ^ 1);
          mbar_arrive_expect_tx(k_full(s), Tr::kKVBytes);
#pragma unroll
          for (int db = 0; db < Tr::kDBlocks; ++db) {
            tma_load_4d(sK + s * Tr::kKVBytes + db * Tr::kKVBlockBytes, &tp.k, k_full(s), 64 * db,
                        row, kvh, b);
          }
          if constexpr (kBiasTiles) {
            // The tile's bias entries: keys [row, row + kBlockN) of the block's query rows, in
            // boxes of 64 keys (dense calls only: row is the key). A broadcast dimension of the
            // bias has one index, 0; TMA zero-fills rows past Lq and keys past Lk.
            const int bias_h = p.bias_stride.h != 0 ? h : 0, bias_b = p.bias_stride.b != 0 ? b : 0;
            mbar_wait(b_empty(s), phase ^ 1);
            mbar_arrive_expect_tx(b_full(s), Tr::kBiasTileBytes);
#pragma unroll
            for (int kb = 0; kb < kBlockN / 64; ++kb) {
              tma_load_4d(sB + s * Tr::kBiasTileBytes + kb * Tr::kBiasBoxBytes, &tp.bias, b_full(s),
                          row + 64 * kb, q_row, bias_h, bias_b);
            }
          }
          mbar_wait(v_empty(s), phase ^ 1);
          mbar_arrive_expect_tx(v_full(s), Tr::kKVBytes);
#pragma unroll
          for (int db = 0; db < Tr::kDBlocks; ++db) {
            tma_load_4d(sV + s * Tr::kKVBytes + db * Tr::kKVBlockBytes, &tp.v, v_full(s), 64 * db,
                        row, kvh, b);
          }
        }
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  setmaxnreg_inc<Tr::kConsumerRegs>();
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
  const std::uint64_t q_desc = smem_desc_sw128(sQ + cw * 64 * 128, 16, 1024);
  const std::uint64_t k_desc = smem_desc_sw128(sK, 16, 1024);
  const std::uint64_t v_desc = smem_desc_sw128(sV, Tr::kKVBlockBytes, 1024);

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
  constexpr bool key_bias = kBiasRead == BiasRead::keys;
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
  const unsigned char* const bias_tiles = smem_raw + (sB - smem_addr(smem_raw));

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
        mbar_wait(b_full(stage), (kv_at / kStages) & 1);
        add_tiled_bias<T>(s, bias_tiles + stage * Tr::kBiasTileBytes, Tr::kBiasBoxBytes, block_row,
                          t, p.scale);
        __syncwarp();
        if (lane == 0) mbar_arrive(b_empty(stage));
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

  // Ping-pong turns: per work item each consumer issues its products n_tiles + 1 times (the first
  // Q·Kᵀ, then Q·Kᵀ + P·V per further tile, then the last P·V), waiting for its turn on its own
  // barrier and passing it to the next consumer. The last consumer opens the first turn of the
  // CTA, and its final turn of an item opens the next item that has keys; after the CTA's last
  // such item it passes nothing, so every barrier sees as many arrivals as waits.
  constexpr bool kPingPong = Tr::kConsumers > 1;
  auto later_item_has_keys = [&](int index) {
    for (int next = index + stride; next < items; next += stride) {
      if (item_at(next).n_tiles > 0) return true;
    }
    return false;
  };
  if constexpr (kPingPong) {
    if (cw == kLastConsumer && later_item_has_keys(first_item - stride)) {
      named_bar_arrive(Tr::kTurnBarrier, 256);
    }
  }

  int kv = 0;  // K/V tiles consumed so far: the ring position
  int local = 0;
  for (int index = first_item; index < items; index += stride, ++local) {
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

    const int turns = n_tiles > 0 ? n_tiles + 1 : 0;
    int turn = 0;
    const bool pass_last =
        kPingPong && cw == kLastConsumer && turns > 0 && later_item_has_keys(index);
    auto begin_turn = [&] {
      if constexpr (kPingPong) named_bar_sync(Tr::kTurnBarrier + cw, 256);
    };
    auto end_turn = [&] {
      if constexpr (kPingPong) {
        if (cw != kLastConsumer || turn != turns - 1 || pass_last) {
          named_bar_arrive(Tr::kTurnBarrier + (cw + 1) % Tr::kConsumers, 256);
        }
      }
      ++turn;
    };

#pragma unroll
    for (int d = 0; d < kDT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    row_m[0] = row_m[1] = -INFINITY;
    row_l[0] = row_l[1] = 0.0f;

    const int qs = local % kQStages;
    q_base = qs * Tr::kQBytes;
    mbar_wait(q_full(qs), (local / kQStages) & 1);
    if (n_tiles > 0) {
      if constexpr (key_bias) {  // the first tile's entries, before its products
        load_key_bias(n_first + n_tiles - 1);
        store_key_bias();
      }
      {  // the first tile (key block n_first + n_tiles - 1): Q·Kᵀ alone
        const int stage = kv % kStages;
        float alpha[2];
        begin_turn();
        mbar_wait(k_full(stage), (kv / kStages) & 1);
        wgmma_fence();
        issue_qk(s, stage);
        wgmma_commit();
        end_turn();
        if constexpr (kDropout) draw_keep(n_first + n_tiles - 1);
        if (key_bias && n_tiles > 1) load_key_bias(n_first + n_tiles - 2);
        wgmma_wait<0>();
        fence_operands(s);
        if (lane == 0) mbar_arrive(k_empty(stage));
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
        begin_turn();
        mbar_wait(k_full(stage), phase);
        mbar_wait(v_full(prev), prev_phase);  // V of the previous tile was loaded before this K
        wgmma_fence();
        issue_qk(s, stage);
        wgmma_commit();
        issue_pv(prev);
        wgmma_commit();
        end_turn();
        if (key_bias && it + 1 < n_tiles) load_key_bias(n_first + n_tiles - 2 - it);
        wgmma_wait<1>();  // Q·Kᵀ done; P·V of the previous tile may still run
        fence_operands(s);
        if (lane == 0) mbar_arrive(k_empty(stage));
        softmax_tile(n_first + n_tiles - 1 - it, stage, kv + it, alpha);
        if (key_bias && it + 1 < n_tiles) store_key_bias();
        wgmma_wait<0>();
        fence_operands(o);
        if (lane == 0) mbar_arrive(v_empty(prev));
        rescale_rows(o, alpha);
        pack_p();
      }
      {  // the last P·V
        const int last = (kv + n_tiles - 1) % kStages;
        begin_turn();
        mbar_wait(v_full(last), ((kv + n_tiles - 1) / kStages) & 1);
        wgmma_fence();
        issue_pv(last);
        wgmma_commit();
        end_turn();
        wgmma_wait<0>();
        fence_operands(o);
        if (lane == 0) mbar_arrive(v_empty(last));
      }
    }
    kv += n_tiles;
    if (lane == 0) mbar_arrive(q_empty(qs));  // this warp's products are done with Q

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
#endif
}

}  // namespace memeff::cuda::sm90
