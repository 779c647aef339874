// Packed sequences (AttentionArgs::packed) on the host: the views of one sequence inside the
// packed tensors, and the loop that runs a host backend's dense kernels once per sequence as a
// B = 1 problem whose dropout map keeps b = s (Problem::rng_batch0), so the packed run draws the
// padded batch's mask. The CUDA kernels read the offsets themselves
// (src/cuda/kernels/common/varlen.cuh).
#pragma once

#include <cstdint>
#include <vector>

#include "memeff/attention.h"
#include "memeff/backend.h"

namespace memeff::detail {

// Rows of sequence s: queries [q0, q0 + Lq) and keys [k0, k0 + Lk) of the packed tensors.
struct SequenceRows {
  std::int64_t s = 0, q0 = 0, Lq = 0, k0 = 0, Lk = 0;
};

// The sequences of a packed call whose offsets are in host memory (validated).
std::vector<SequenceRows> host_sequences(const AttentionArgs& args, const Problem& pb);

// [1, H, rows, last] view of rows [row0, row0 + rows) of a packed [total, H, last] view.
TensorView sequence_view(const TensorView& packed, std::int64_t row0, std::int64_t rows);
// [1, Hq, rows] view of columns [row0, row0 + rows) of a packed lse [Hq, total_q].
TensorView sequence_lse_view(const TensorView& lse, std::int64_t row0, std::int64_t rows);
// The dense B = 1 problem of one sequence, drawing the mask of b = s.
Problem sequence_problem(const Problem& packed, const SequenceRows& r);

// A host backend's pass over a packed call: its dense pass once per sequence.
void forward_per_sequence(Backend& backend, const Problem& pb, const AttentionArgs& args,
                          const TensorView& out, const TensorView& lse, const Options& options);
void backward_per_sequence(Backend& backend, const Problem& pb, const AttentionArgs& args,
                           const BackwardTensors& g, const Options& options);

}  // namespace memeff::detail
