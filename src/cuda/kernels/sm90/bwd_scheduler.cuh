// The sm90 backward's tiles (bwd_kernel.cuh): which key block of which (batch, kv head) a CTA
// takes. Here the packed calls' key block, from the varlen tile scheduler over cu_seqlens_k.
#pragma once

#include <cstdint>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/varlen.cuh"
#include "cuda/kernels/sm90/bwd_traits.cuh"

namespace memeff::cuda::sm90 {

// A packed call's key block with its sequence. Plain members only: it lives in a __shared__
// variable.
struct PackedKeyBlock {
  int valid;  // 0: the CTA's tile is past the last one (it exits)
  int seq, block;
  int q0, k0, Lq, Lk, causal_shift;  // the sequence (SeqSpan; packed rows fit in int32)
  int m_base;  // its first query block in the workspace's per-head layout (packed_block0)
};

// The CTA's key block (tile blockIdx.x of the scheduler over cu_seqlens_k): warp 0 runs the
// scheduler's scan, thread 0 stores the result in shared memory, every thread of the CTA gets its
// address. A CTA-wide barrier: call it from all threads, before the roles split.
template <int kBlockN, int kBlockM>
__device__ __forceinline__ const PackedKeyBlock* packed_key_block_of_cta(const BackwardParams& p) {
  __shared__ PackedKeyBlock slot;
  if (threadIdx.x < 32) {
    PackedKeyBlock kb{};
    const VarlenTile vt = varlen_tile(p.cu_seqlens_k, p.B, p.total_k, p.Lk, kBlockN,
                                      static_cast<std::int64_t>(blockIdx.x));
    if (vt.seq < p.B) {
      const SeqSpan span = seq_span(p, vt.seq);
      kb.valid = 1;
      kb.seq = vt.seq;
      kb.block = vt.block;
      kb.q0 = static_cast<int>(span.q0);
      kb.k0 = static_cast<int>(span.k0);
      kb.Lq = static_cast<int>(span.Lq);
      kb.Lk = static_cast<int>(span.Lk);
      kb.causal_shift = static_cast<int>(span.causal_shift);
      kb.m_base = static_cast<int>(packed_block0(span.q0, vt.seq, kBlockM));
    }
    if (threadIdx.x == 0) slot = kb;
  }
  __syncthreads();
  return &slot;
}

}  // namespace memeff::cuda::sm90
