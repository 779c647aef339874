// dbias in both backward kernel families (sm80 mma.sync, sm90 wgmma): written from the dSᵀ
// accumulator fragments, whose layout is the same in both (a thread's rows are two keys, its
// columns the queries 8n + 2t + {0, 1} of each n8 tile n). The conversion of a reduced dbias's
// fp32 accumulator is in common/bwd_prepost.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/types.cuh"

namespace memeff::cuda {

// dbias = ds_scale · ds (the sm90 kernel holds dS / keep_scale).
// DbiasMode::direct: dbias has the full [B, Hq, Lq, Lk] extent: dS is written as it is.
// DbiasMode::reduced: dbias broadcasts over some of B, H, Lq: dS is added into the fp32 accumulator
// `accum` [dB, dH, dL, Lk] (contiguous), summed over this thread's queries and the four lanes of
// its quad first when it broadcasts over queries. All 32 lanes must call it (quad shuffles).
template <class T, int kNT>
__device__ __forceinline__ void write_dbias(const BackwardParams& p, DbiasMode mode, float* accum,
                                            const float (&ds)[kNT][4], float ds_scale, int b, int h,
                                            std::int64_t m0, std::int64_t j_lo, std::int64_t j_hi,
                                            int t) {
  if (mode == DbiasMode::direct) {
    const std::int64_t base = b * p.dbias_stride.b + h * p.dbias_stride.h;
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const std::int64_t i = m0 + n * 8 + 2 * t + (r & 1);
        const std::int64_t j = (r >> 1) ? j_hi : j_lo;
        if (i < p.Lq && j < p.Lk) {
          const std::int64_t off = base + i * p.dbias_stride.l + j;
          if (p.bias_is_fp32) {
            static_cast<float*>(p.dbias)[off] = ds[n][r] * ds_scale;
          } else {
            static_cast<T*>(p.dbias)[off] = from_float<T>(ds[n][r] * ds_scale);
          }
        }
      }
    }
  } else if (mode == DbiasMode::reduced) {
    const std::int64_t db = p.dbias_shape[0] == 1 ? 0 : b;
    const std::int64_t dh = p.dbias_shape[1] == 1 ? 0 : h;
    const std::int64_t row_base = (db * p.dbias_shape[1] + dh) * p.dbias_shape[2];
    if (p.dbias_shape[2] == 1 && p.Lq > 1) {
      // Broadcast over query rows: sum this thread's columns, then over the 4 lanes of a row.
      float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        const std::int64_t i = m0 + n * 8 + 2 * t;
        sum_lo += (i < p.Lq ? ds[n][0] : 0.f) + (i + 1 < p.Lq ? ds[n][1] : 0.f);
        sum_hi += (i < p.Lq ? ds[n][2] : 0.f) + (i + 1 < p.Lq ? ds[n][3] : 0.f);
      }
#pragma unroll
      for (int sh = 1; sh < 4; sh <<= 1) {
        sum_lo += __shfl_xor_sync(0xFFFFFFFFu, sum_lo, sh);
        sum_hi += __shfl_xor_sync(0xFFFFFFFFu, sum_hi, sh);
      }
      if (t == 0) {
        if (j_lo < p.Lk) atomicAdd(accum + row_base * p.Lk + j_lo, sum_lo * ds_scale);
        if (j_hi < p.Lk) atomicAdd(accum + row_base * p.Lk + j_hi, sum_hi * ds_scale);
      }
    } else {
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const std::int64_t i = m0 + n * 8 + 2 * t + (r & 1);
          const std::int64_t j = (r >> 1) ? j_hi : j_lo;
          if (i < p.Lq && j < p.Lk) {
            atomicAdd(accum + (row_base + i) * p.Lk + j, ds[n][r] * ds_scale);
          }
        }
      }
    }
  }
}

}  // namespace memeff::cuda
