// The sm90 (Hopper, sm_90a) fused attention forward: warp-specialized, TMA-fed, wgmma-based and
// persistent.
//
// The grid holds one CTA per SM; each walks the work items (a query block of kBlockM =
// 64·kConsumers rows of one batch·head) from blockIdx.x on: blockIdx.x + gridDim.x, ... where
// every item costs the same, and where costs differ (a causal mask) whichever item a counter in
// global memory hands out next (fwd_scheduler.cuh). Warpgroup 0 is the producer: after shrinking
// its registers (setmaxnreg) one thread issues every TMA load: an item's Q once its buffer is
// free (two buffers at head dim 64, so the next item's Q arrives while the consumers still run
// the current one; one elsewhere, where it arrives while they finish it: fwd_traits.cuh), then K
// and V tiles of kBlockN keys into a kStages-deep ring of shared-memory
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
// time share a few heads' K and V in L2; under a causal mask they come in bands of a few heads,
// each walked query block by query block, heaviest first (common/block_order.h).
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
//
// Pieces: the kernel below sets up the shared memory (ForwardSmem, fwd_smem.cuh) and the CTA's
// work items (ForwardScheduler, fwd_scheduler.cuh), then runs the producer (load_forward_tiles,
// fwd_producer.cuh) or a consumer (consume_forward_items, fwd_consumer.cuh: the mainloop with its
// ping-pong turns, softmax and dropout, and the epilogue). ForwardVariant (fwd_variant.cuh) carries
// the instantiation's compile-time switches to them.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/sm90/fwd_consumer.cuh"
#include "cuda/kernels/sm90/fwd_producer.cuh"
#include "cuda/kernels/sm90/fwd_scheduler.cuh"
#include "cuda/kernels/sm90/fwd_smem.cuh"
#include "cuda/kernels/sm90/fwd_traits.cuh"
#include "cuda/kernels/sm90/fwd_variant.cuh"
#include "cuda/kernels/sm90/ptx.cuh"

namespace memeff::cuda::sm90 {

// kBiasRead: how the bias is read (fwd_traits.cuh): per score from global memory, a key-padding
// bias staged per key tile by the consumers (key_bias in fwd_consumer.cuh), or 16-bit tiles the
// producer loads by TMA beside K and V (bias_tiles there).
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
  using V = ForwardVariant<T, Tr, kDropout, kBiasRead, kPacked, kMods>;
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Compiled for another target (sm_80): wgmma and setmaxnreg exist only in sm_90a, and the
  // launcher runs this kernel on compute capability 9.0 alone.
  __trap();
#else
  const ForwardParams& p = tp.p;
  // What the params switch on at run time in the modifiers' kernel (constants elsewhere).
  const bool packed_call = kPacked || (kMods && p.cu_seqlens_q != nullptr);
  const bool has_bias = V::kBias && (!kMods || p.bias != nullptr);
  const bool dropout_on = kDropout && (!V::kRuntimeDropout || p.has_dropout);

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const ForwardSmem<V> smem(smem_raw);

  const int tid = threadIdx.x;
  // Broadcast from lane 0 so the compiler knows the role is warp-uniform (wgmma in a path it
  // cannot prove uniform gets serialized).
  const int warpgroup = __shfl_sync(0xFFFFFFFFu, tid / 128, 0);
  // A packed CTA has its one item (an extra CTA-wide barrier); one past its head's last tile
  // leaves at once, every thread, before any barrier is set up.
  [[maybe_unused]] PackedItem packed{};
  if (packed_call) {
    packed = packed_item_of_cta<Tr>(p, tp.packed_tiles);
    if (!packed.valid) return;
  }
  const ForwardScheduler<V> scheduler(tp, packed_call, packed);

  if (tid == 0) {
    smem.init_barriers();
    scheduler.clear_slots();  // before the barrier below: no stale item from an earlier launch
  }
  __syncthreads();  // the last CTA-wide barrier: the producer's idle warps leave below

  if (warpgroup == 0) {
    // ---------------- producer ----------------
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0) load_forward_tiles(tp, smem, scheduler);
    return;
  }

  // ---------------- consumers ----------------
  setmaxnreg_inc<Tr::kConsumerRegs>();
  consume_forward_items(tp, smem, scheduler, has_bias, dropout_on, warpgroup, tid);
#endif
}

}  // namespace memeff::cuda::sm90
