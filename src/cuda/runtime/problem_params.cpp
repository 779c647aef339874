// Problem -> kernel params, and the shared call-level steps (problem_params.h).
#include "cuda/runtime/problem_params.h"

#include <cstdint>
#include <numbers>
#include <vector>

#include "cuda/runtime/check.h"
#include "cuda/runtime/fill.h"

namespace memeff::cuda {

ElemType elem_type(DType dtype) { return dtype == DType::bf16 ? ElemType::bf16 : ElemType::fp16; }

Strides strides_of(const TensorView& t) {
  if (t.rank == 3) {  // packed [total, H, last]: sequence b adds its first row (params.h)
    return Strides{0, t.shape[1] == 1 ? 0 : t.stride[1], t.stride[0]};
  }
  // Broadcast (size-1) dimensions read index 0 only: stride 0 keeps the kernels' math uniform.
  return Strides{t.shape[0] == 1 ? 0 : t.stride[0], t.shape[1] == 1 ? 0 : t.stride[1],
                 t.shape[2] == 1 ? 0 : t.stride[2]};
}

namespace {

Causal causal_of(CausalMode mode) {
  switch (mode) {
    case CausalMode::top_left:
      return Causal::top_left;
    case CausalMode::bottom_right:
      return Causal::bottom_right;
    case CausalMode::none:
      break;
  }
  return Causal::none;
}

// The window's reach, ALiBi's presence and the softcap's factors (the slopes' pointer comes with
// the views). The window's flag stays off where the causal mask is its only bound.
void fill_score_mods(ScoreMods& m, const Problem& pb) {
  static_assert(ScoreMods::kUnbounded == Problem::kWindowCap, "one cap for an unbounded side");
  const bool causal = pb.causal != CausalMode::none;
  if (pb.window_left >= 0 || (!causal && pb.window_right >= 0)) {
    m.flags |= ScoreMods::kWindow;
    m.left_reach = pb.window_left >= 0 ? pb.window_left : ScoreMods::kUnbounded;
    m.right_reach = causal ? 0 : (pb.window_right >= 0 ? pb.window_right : ScoreMods::kUnbounded);
  }
  if (pb.has_alibi) m.flags |= ScoreMods::kAlibi;
  // The cap of scale·q·k = 0 is 0: with scale 0 the cap changes nothing.
  if (pb.has_softcap() && pb.scale != 0.0) {
    m.flags |= ScoreMods::kSoftcap;
    m.softcap_in = static_cast<float>(pb.scale / pb.softcap);
    m.softcap_out = static_cast<float>(pb.softcap / pb.scale);
    m.softcap_exp2 = static_cast<float>(2.0 * std::numbers::log2e * pb.scale / pb.softcap);
  }
}

void fill_from_problem(ForwardParams& p, const Problem& pb) {
  p.B = static_cast<int>(pb.B);
  p.Hq = static_cast<int>(pb.Hq);
  p.Hkv = static_cast<int>(pb.Hkv);
  p.group = pb.Hkv > 0 ? static_cast<int>(pb.Hq / pb.Hkv) : 1;
  p.Lq = pb.Lq;
  p.Lk = pb.Lk;
  p.D = static_cast<int>(pb.D);
  p.Dv = static_cast<int>(pb.Dv);
  p.bias_is_fp32 = pb.has_bias && pb.bias_dtype == DType::f32;
  p.scale = static_cast<float>(pb.scale);
  p.scale_log2 = static_cast<float>(pb.scale * std::numbers::log2e);
  p.causal = causal_of(pb.causal);
  p.causal_shift = pb.position_shift();  // the causal mask's diagonal where it has one
  fill_score_mods(p.mods, pb);
  p.has_dropout = pb.has_dropout();
  p.keep_threshold = pb.dropout.threshold;
  p.keep_scale = static_cast<float>(pb.dropout.keep_scale);
  p.total_q = pb.total_q;  // packed calls (the offsets' pointers come with the views)
  p.total_k = pb.total_k;
  p.q_start = static_cast<std::uint32_t>(pb.q_start);         // < 2^32 (validation)
  p.k_block64 = static_cast<std::uint32_t>(pb.k_start / 64);  // exact where it matters (reasons)
  p.kv_block = pb.kv_block;
}

void fill_from_views(ForwardParams& p, const AttentionArgs& args, const TensorView& out,
                     const TensorView& lse) {
  p.q = args.q.data;
  p.k = args.k.data;
  p.v = args.v.data;
  p.out = out.data;
  p.lse = static_cast<float*>(lse.data);
  p.q_stride = strides_of(args.q);
  p.k_stride = strides_of(args.k);
  p.v_stride = strides_of(args.v);
  p.out_stride = strides_of(out);
  if (args.packed) {  // lse [Hq, total_q]: rows are contiguous, sequence b adds its first row
    p.lse_stride_b = 0;
    p.lse_stride_h = lse.shape[0] == 1 ? 0 : lse.stride[0];
    p.cu_seqlens_q = static_cast<const int*>(args.packed->cu_seqlens_q.data);
    p.cu_seqlens_k = static_cast<const int*>(args.packed->cu_seqlens_k.data);
    p.total_q = args.q.shape[0];
    p.total_k = args.k.shape[0];
  } else {
    p.lse_stride_b = lse.shape[0] == 1 ? 0 : lse.stride[0];
    p.lse_stride_h = lse.shape[1] == 1 ? 0 : lse.stride[1];
  }
  if (args.bias) {
    p.bias = args.bias->data;
    p.bias_stride = strides_of(*args.bias);
  }
  if (args.alibi_slopes) {  // [Hq] or [B, Hq] ([S, Hq] packed), fp32
    const TensorView& s = *args.alibi_slopes;
    p.mods.alibi_slopes = static_cast<const float*>(s.data);
    p.mods.alibi_stride_b = s.rank == 2 ? s.stride[0] : 0;
    p.mods.alibi_stride_h = s.stride[s.rank - 1];
  }
  p.seed = args.rng.seed;
  p.offset = args.rng.offset;
  p.seed_ptr = args.rng.device_seed;
  p.offset_ptr = args.rng.device_offset;
}

}  // namespace

ForwardParams forward_params(const Problem& pb) {
  ForwardParams p;
  fill_from_problem(p, pb);
  return p;
}

BackwardParams backward_params(const Problem& pb) {
  BackwardParams p;
  fill_from_problem(p, pb);
  if (pb.has_bias) {  // the shape a dbias of this bias has
    p.dbias_shape[0] = pb.bias_bcast_b ? 1 : static_cast<int>(pb.B);
    p.dbias_shape[1] = pb.bias_bcast_h ? 1 : static_cast<int>(pb.Hq);
    p.dbias_shape[2] = pb.bias_bcast_q ? 1 : static_cast<int>(pb.Lq);
  }
  return p;
}

ForwardParams forward_params(const Problem& pb, const AttentionArgs& args, const TensorView& out,
                             const TensorView& lse) {
  ForwardParams p = forward_params(pb);
  fill_from_views(p, args, out, lse);
  return p;
}

BackwardParams backward_params(const Problem& pb, const AttentionArgs& args,
                               const BackwardTensors& g, const Options& options) {
  BackwardParams p;
  fill_from_problem(p, pb);
  fill_from_views(p, args, g.out, g.lse);
  p.dout = g.dout.data;
  p.dq = g.dq.data;
  p.dk = g.dk.data;
  p.dv = g.dv.data;
  p.dout_stride = strides_of(g.dout);
  p.dq_stride = strides_of(g.dq);
  p.dk_stride = strides_of(g.dk);
  p.dv_stride = strides_of(g.dv);
  if (g.dbias) {
    p.dbias = g.dbias->data;
    p.dbias_stride = strides_of(*g.dbias);
    for (int d = 0; d < 3; ++d) p.dbias_shape[d] = static_cast<int>(g.dbias->shape[d]);
  }
  p.deterministic = options.deterministic;
  return p;
}

void check_packed_offsets(const AttentionArgs& args, const Problem& pb, cudaStream_t stream) {
  if (!pb.packed || !args.packed->check_offsets) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return;  // no synchronization inside a capture
  const std::size_t n = static_cast<std::size_t>(pb.B) + 1;
  std::vector<std::int32_t> host(2 * n);
  check_cuda(cudaMemcpyAsync(host.data(), args.packed->cu_seqlens_q.data, n * sizeof(std::int32_t),
                             cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync(cu_seqlens_q to the host)");
  check_cuda(cudaMemcpyAsync(host.data() + n, args.packed->cu_seqlens_k.data,
                             n * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync(cu_seqlens_k to the host)");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(reading cu_seqlens)");
  validate_packed_offsets(host.data(), host.data() + n, pb);
}

bool backward_empty_edges(const Problem& pb, const BackwardTensors& g, cudaStream_t stream) {
  if (pb.B == 0 || pb.Hq == 0) return true;
  if (pb.Lk != 0 && pb.Lq != 0) return false;
  // No keys or no queries: every gradient is zero. Dense, the side without rows is empty;
  // packed (Lq and Lk are the maximum lengths), the other side's rows still need their zeros.
  fill(g.dq, 0.0, stream);
  fill(g.dk, 0.0, stream);
  fill(g.dv, 0.0, stream);
  if (g.dbias) fill(*g.dbias, 0.0, stream);
  return true;
}

}  // namespace memeff::cuda
