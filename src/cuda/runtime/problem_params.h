// The translation of a validated Problem and its views into the kernels' plain params
// (kernels/common/params.h), and the call-level steps every CUDA backend shares around the
// kernels: the packed offsets' check and the backward's empty edges.
#pragma once

#include <cuda_runtime.h>

#include "cuda/kernels/common/params.h"
#include "memeff/attention.h"
#include "memeff/backend.h"

namespace memeff::cuda {

ElemType elem_type(DType dtype);  // bf16, else fp16
// Strides of a view for the kernels: broadcast (size-1) dimensions get stride 0; a packed
// [total, H, last] view gets b stride 0 and its row stride as l (params.h).
Strides strides_of(const TensorView& t);

// Sizes, modes and RNG values only: what the reasons and workspace sizes can know without views
// (a backward's dbias shape too, since its workspace counts a reduced dbias's accumulator).
ForwardParams forward_params(const Problem& pb);
BackwardParams backward_params(const Problem& pb);
// Everything, from the problem and its views.
ForwardParams forward_params(const Problem& pb, const AttentionArgs& args, const TensorView& out,
                             const TensorView& lse);
BackwardParams backward_params(const Problem& pb, const AttentionArgs& args,
                               const BackwardTensors& g, const Options& options);

// A packed call's offsets, when PackedSequences::check_offsets asks for it: copied to the host
// (a synchronization of `stream`) and validated; skipped while the stream captures a graph.
void check_packed_offsets(const AttentionArgs& args, const Problem& pb, cudaStream_t stream);

// The backward's empty edges, alike for every CUDA backend: B·Hq = 0 does nothing, Lk = 0 or
// Lq = 0 gives dq = dk = dv = dbias = 0 (those of them that have elements: packed calls, whose
// Lq and Lk are maximum lengths, can have both). Returns whether the call was one of them.
bool backward_empty_edges(const Problem& pb, const BackwardTensors& g, cudaStream_t stream);

}  // namespace memeff::cuda
