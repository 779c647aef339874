// Declarations shared by the backward launcher (src/cuda/launch/bwd_launch.cu) and the
// per-instantiation files (src/cuda/inst/bwd_*.cu): the workspace layout (dense or packed) and one
// run_backward per dtype x head-dim bucket.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/hostdevice.h"
#include "cuda/params.h"
#include "cuda/sm80/fwd_dispatch.cuh"

namespace memeff::cuda {

// Head-dim buckets with a compiled backward kernel; D and Dv up to the bucket are zero-padded.
inline constexpr int kBackwardHeadDims[] = {64, 128, 256};

// The fp32 rows of softmax_d and dq_accum, [batches][Hq][rows] contiguous. Dense: one per
// (b, h, i). Packed: one per (h, packed query row) in a single batch (q's b stride is 0), so a
// sequence's rows sit at its packed rows: no per-sequence padding, since the kernels never touch
// a row at or past a sequence's length, and rows of no sequence stay 0 (dq = 0 there).
struct WorkspaceRows {
  std::int64_t batches = 0, rows = 0;  // rows per (batch, head)
};
MEMEFF_HD WorkspaceRows workspace_rows(const ForwardParams& p) {
  return packed_layout(p) ? WorkspaceRows{1, p.total_q} : WorkspaceRows{p.B, p.Lq};
}

// Byte offsets inside the backward workspace (each 16-byte aligned).
struct BwdWorkspace {
  std::size_t softmax_d = 0, dq_accum = 0, dbias_accum = 0, total = 0;
  std::int64_t dbias_accum_elems = 0;
  int dbias_mode = 0;  // 0 no dbias, 1 written directly, 2 fp32 accumulator + convert
};

inline BwdWorkspace backward_workspace_layout(const BackwardParams& p) {
  auto align16 = [](std::size_t n) { return (n + 15) / 16 * 16; };
  BwdWorkspace ws;
  const WorkspaceRows wr = workspace_rows(p);
  const std::size_t rows = static_cast<std::size_t>(wr.batches) * p.Hq * wr.rows;
  ws.softmax_d = 0;
  ws.dq_accum = align16(rows * sizeof(float));
  ws.dbias_accum = ws.dq_accum + align16(rows * static_cast<std::size_t>(p.D) * sizeof(float));
  ws.total = ws.dbias_accum;
  // dbias_shape is known when the caller filled it (always when dbias is given).
  if (p.dbias_shape[0] > 0) {
    const bool reduced = dbias_is_reduced(p);
    if (reduced) {
      ws.dbias_accum_elems = static_cast<std::int64_t>(p.dbias_shape[0]) * p.dbias_shape[1] *
                             p.dbias_shape[2] * p.Lk;
      ws.total += align16(static_cast<std::size_t>(ws.dbias_accum_elems) * sizeof(float));
    }
    if (p.dbias != nullptr) ws.dbias_mode = reduced ? 2 : 1;
  }
  if (ws.dbias_mode != 2) ws.dbias_accum_elems = 0;
  return ws;
}

template <class T, int kHeadDim>
void run_backward(BackwardParams params, void* workspace, cudaStream_t stream);

}  // namespace memeff::cuda
