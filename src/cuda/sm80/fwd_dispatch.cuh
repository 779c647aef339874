// Declarations shared by the forward launcher (src/cuda/launch/fwd_launch.cu) and the
// per-instantiation files (src/cuda/inst/fwd_*.cu): one run_forward per dtype x head-dim bucket,
// the packed-or-dense test of params, plus the small fill kernels the cuda backend uses for
// empty-length edge cases.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/hostdevice.h"
#include "cuda/params.h"

namespace memeff::cuda {

// Head-dim buckets with a compiled kernel; D and Dv up to the bucket are zero-padded in smem.
inline constexpr int kForwardHeadDims[] = {64, 128, 256};

template <class T, int kHeadDim>
void run_forward(const ForwardParams& params, cudaStream_t stream);

// Whether params describe packed sequences (grids and workspaces differ). With views, the
// offsets' pointers say it; params filled from a Problem alone (dispatch, workspace sizes) have
// none, but a packed problem brings its row counts (dense ones leave them at 0), and a packed
// call without rows has no work that either reading could size differently.
MEMEFF_HD bool packed_layout(const ForwardParams& p) {
  return p.cu_seqlens_q != nullptr || p.total_q > 0 || p.total_k > 0;
}

// Sets every element of a strided [n0, n1, n2, n3] tensor (last stride 1) to `value`
// (element_bytes 2 or 4: the value is converted to fp32 / fp16 / bf16 by `kind`).
enum class FillKind { f32, f16, bf16 };
void fill_strided(void* data, FillKind kind, const std::int64_t (&shape)[4],
                  const std::int64_t (&stride)[4], float value, cudaStream_t stream);

}  // namespace memeff::cuda
