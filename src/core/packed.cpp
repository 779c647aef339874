// Packed sequences on the host (see packed.h): the per-sequence views, problems and arguments
// that let a host backend run a packed call as one dense B = 1 call per sequence, drawing the
// padded batch's dropout mask.
#include "core/packed.h"

#include <cstdint>
#include <vector>

namespace memeff::detail {

std::vector<SequenceRows> host_sequences(const AttentionArgs& args, const Problem& pb) {
  const auto* cu_q = static_cast<const std::int32_t*>(args.packed->cu_seqlens_q.data);
  const auto* cu_k = static_cast<const std::int32_t*>(args.packed->cu_seqlens_k.data);
  std::vector<SequenceRows> rows(static_cast<std::size_t>(pb.B));
  for (std::int64_t s = 0; s < pb.B; ++s) {
    rows[s] = {s, cu_q[s], cu_q[s + 1] - cu_q[s], cu_k[s], cu_k[s + 1] - cu_k[s]};
  }
  return rows;
}

TensorView sequence_view(const TensorView& packed, std::int64_t row0, std::int64_t rows) {
  TensorView v = packed;
  v.rank = 4;
  v.shape = {1, packed.shape[1], rows, packed.shape[2]};
  v.stride = {0, packed.stride[1], packed.stride[0], 1};
  if (v.data != nullptr) {
    v.data = static_cast<char*>(packed.data) +
             row0 * packed.stride[0] * static_cast<std::int64_t>(dtype_size(packed.dtype));
  }
  return v;
}

TensorView sequence_lse_view(const TensorView& lse, std::int64_t row0, std::int64_t rows) {
  TensorView v = lse;
  v.rank = 3;
  v.shape = {1, lse.shape[0], rows, 0};
  v.stride = {0, lse.stride[0], 1, 0};
  if (v.data != nullptr) v.data = static_cast<float*>(lse.data) + row0;
  return v;
}

Problem sequence_problem(const Problem& packed, const SequenceRows& r) {
  Problem p = packed;
  p.packed = false;
  p.B = 1;
  p.Lq = r.Lq;
  p.Lk = r.Lk;
  p.total_q = 0;
  p.total_k = 0;
  p.rng_batch0 = packed.rng_batch0 + r.s;
  return p;
}

namespace {

AttentionArgs sequence_args(const AttentionArgs& args, const SequenceRows& r) {
  AttentionArgs a = args;
  a.packed.reset();
  a.q = sequence_view(args.q, r.q0, r.Lq);
  a.k = sequence_view(args.k, r.k0, r.Lk);
  a.v = sequence_view(args.v, r.k0, r.Lk);
  if (a.alibi_slopes && a.alibi_slopes->rank == 2) {  // [S, Hq]: the sequence's row
    TensorView& slopes = *a.alibi_slopes;
    slopes.data = static_cast<float*>(slopes.data) + r.s * slopes.stride[0];
    slopes.shape[0] = 1;
  }
  return a;
}

}  // namespace

void forward_per_sequence(Backend& backend, const Problem& pb, const AttentionArgs& args,
                          const TensorView& out, const TensorView& lse, const Options& options) {
  for (const SequenceRows& r : host_sequences(args, pb)) {
    backend.forward(sequence_problem(pb, r), sequence_args(args, r), sequence_view(out, r.q0, r.Lq),
                    sequence_lse_view(lse, r.q0, r.Lq), options);
  }
}

void backward_per_sequence(Backend& backend, const Problem& pb, const AttentionArgs& args,
                           const BackwardTensors& g, const Options& options) {
  for (const SequenceRows& r : host_sequences(args, pb)) {
    BackwardTensors sg;
    sg.dout = sequence_view(g.dout, r.q0, r.Lq);
    sg.out = sequence_view(g.out, r.q0, r.Lq);
    sg.lse = sequence_lse_view(g.lse, r.q0, r.Lq);
    sg.dq = sequence_view(g.dq, r.q0, r.Lq);
    sg.dk = sequence_view(g.dk, r.k0, r.Lk);
    sg.dv = sequence_view(g.dv, r.k0, r.Lk);
    backend.backward(sequence_problem(pb, r), sequence_args(args, r), sg, options);
  }
}

}  // namespace memeff::detail
