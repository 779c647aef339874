// The sm90 backward's epilogue (bwd_kernel.cuh): a tile's dK and dV from the consumers'
// accumulators, through shared memory, to their rows in global memory.
#pragma once

#include <cstdint>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/types.cuh"
#include "cuda/kernels/sm90/ptx.cuh"

namespace memeff::cuda::sm90 {

// The epilogue: a consumer warpgroup's dK·dk_scale and dV·dv_scale (its 64 keys' rows of the
// accumulators, in the Sᵀ fragment layout) into `out` (2 x kOutBytes of shared memory, rows
// unpermuted, 16-byte chunks swizzled by row), then, once both warpgroups have, the block's
// kBlockN keys from n0 on from there to the rows of (b, kvh) in dk and dv that start at key row
// k0() (the sequence's first when packed): those below seq_lk(), the columns below D and Dv.
template <class T, class Tr, class K0, class SeqLk>
__device__ __forceinline__ void store_dk_dv(const float (&dk)[Tr::kDT][4],
                                            const float (&dv)[Tr::kDT][4], float dk_scale,
                                            float dv_scale, unsigned char* out,
                                            const BackwardParams& p, int b, int kvh,
                                            std::int64_t n0, K0&& k0, SeqLk&& seq_lk, int wg,
                                            int ctid, int warp, int g, int t) {
  unsigned char* const out_k = out;
  unsigned char* const out_v = out_k + Tr::kOutBytes;
  constexpr int kRowBytes = Tr::kHeadDim * 2;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = 64 * wg + 8 * g + 2 * warp + hh;  // the key, unpermuted
#pragma unroll
    for (int j = 0; j < Tr::kDT; ++j) {
      const int off = row * kRowBytes + ((j ^ ((row >> 3) & 7)) << 4) + 4 * t;
      *reinterpret_cast<std::uint32_t*>(out_k + off) =
          pack2<T>(dk[j][2 * hh] * dk_scale, dk[j][2 * hh + 1] * dk_scale);
      *reinterpret_cast<std::uint32_t*>(out_v + off) =
          pack2<T>(dv[j][2 * hh] * dv_scale, dv[j][2 * hh + 1] * dv_scale);
    }
  }
  named_bar_sync(Tr::kConsumerBarrier, 128 * Tr::kConsumers);
  T* const dk_rows =
      static_cast<T*>(p.dk) + b * p.dk_stride.b + kvh * p.dk_stride.h + k0() * p.dk_stride.l;
  T* const dv_rows =
      static_cast<T*>(p.dv) + b * p.dv_stride.b + kvh * p.dv_stride.h + k0() * p.dv_stride.l;
  constexpr int kRowChunks = Tr::kHeadDim / 8;
  for (int c = ctid + 128 * wg; c < Tr::kBlockN * kRowChunks; c += 128 * Tr::kConsumers) {
    const int row = c / kRowChunks, chunk = c % kRowChunks;
    const std::int64_t key = n0 + row;
    if (key >= seq_lk()) continue;
    const int col = 8 * chunk;
    const int off = row * kRowBytes + ((chunk ^ ((row >> 3) & 7)) << 4);
    if (col < p.D) {
      *reinterpret_cast<uint4*>(dk_rows + key * p.dk_stride.l + col) =
          *reinterpret_cast<const uint4*>(out_k + off);
    }
    if (col < p.Dv) {
      *reinterpret_cast<uint4*>(dv_rows + key * p.dv_stride.l + col) =
          *reinterpret_cast<const uint4*>(out_v + off);
    }
  }
}

}  // namespace memeff::cuda::sm90
