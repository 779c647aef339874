// Argument validation for every entry point. Each failure names the argument, what was expected
// and what was given; a successful check yields the Problem that backends decide on.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/dropout_map.h"
#include "memeff/backend.h"
#include "memeff/error.h"

namespace memeff {
namespace {

constexpr const char* kDimNames = "BHLD";
constexpr const char* kPackedDimNames = "THD";  // packed: [total rows, heads, head dim]
constexpr std::int64_t kMaxElementBytes = 8;    // fp64
// The vectors of Problem::vector_aligned: what kernels loading 16-byte vectors need.
constexpr std::int64_t kVectorBytes = 16;

[[noreturn]] void fail(const std::string& arg, const std::string& what) {
  throw Error(ErrorCode::invalid_argument, "argument `" + arg + "`: " + what);
}

std::string shape_str(const TensorView& t) { return t.describe(); }

void check_view(const char* name, const TensorView& t, int rank) {
  if (t.rank != rank) {
    fail(name, "expected rank " + std::to_string(rank) + ", got rank " + std::to_string(t.rank) +
                   (t.rank ? " (" + shape_str(t) + ")" : std::string(" (undefined view)")));
  }
  for (int d = 0; d < rank; ++d) {
    if (t.shape[d] < 0) {
      fail(name, "expected non-negative sizes, got size " + std::to_string(t.shape[d]) +
                     " in dimension " + std::to_string(d) + " (" + shape_str(t) + ")");
    }
  }
  std::int64_t count = 1, reach = 0;
  for (int d = 0; d < rank; ++d) {
    std::int64_t span = 0;
    if (__builtin_mul_overflow(count, t.shape[d], &count) ||
        (t.shape[d] > 0 && (__builtin_mul_overflow(t.shape[d] - 1, t.stride[d], &span) ||
                            span == std::numeric_limits<std::int64_t>::min() ||
                            __builtin_add_overflow(reach, span < 0 ? -span : span, &reach)))) {
      fail(name, "sizes and strides overflow 64-bit offsets (" + shape_str(t) + ")");
    }
  }
  // Byte offsets (kMaxElementBytes per element, and one past the end) stay in range too.
  if (reach > std::numeric_limits<std::int64_t>::max() / (2 * kMaxElementBytes)) {
    fail(name, "sizes and strides overflow 64-bit offsets (" + shape_str(t) + ")");
  }
  if (t.data == nullptr && t.numel() != 0) {
    fail(name, "data pointer is null but the view has " + std::to_string(t.numel()) +
                   " elements (" + shape_str(t) + ")");
  }
  if (t.shape[rank - 1] > 1 && t.stride[rank - 1] != 1) {
    fail(name, "expected a contiguous last dimension (stride 1), got stride " +
                   std::to_string(t.stride[rank - 1]) + " (" + shape_str(t) + ")");
  }
  if (t.device.type != DeviceType::cpu && t.device.type != DeviceType::cuda) {
    fail(name, "expected a cpu or cuda device, got device type " +
                   std::to_string(static_cast<int>(t.device.type)));
  }
  const std::size_t elem = dtype_size(t.dtype);
  if (elem != 0 && reinterpret_cast<std::uintptr_t>(t.data) % elem != 0) {
    fail(name, "expected a data pointer aligned to its element size (" + std::to_string(elem) +
                   " bytes for " + dtype_name(t.dtype) + "), got an address " +
                   std::to_string(reinterpret_cast<std::uintptr_t>(t.data) % elem) +
                   " bytes past a multiple");
  }
  if (t.device.type == DeviceType::cuda && t.device.index < 0) {
    fail(name, "expected a CUDA ordinal >= 0, got " + std::to_string(t.device.index));
  }
}

void check_dim(const char* name, const TensorView& t, int dim, std::int64_t expected,
               const char* why) {
  if (t.shape[dim] != expected) {
    std::ostringstream os;
    os << "expected size " << expected << " in dimension " << dim;
    if (t.rank == 4) os << " (" << kDimNames[dim] << ")";
    if (t.rank == 3) os << " (" << kPackedDimNames[dim] << ")";
    os << " " << why << ", got " << t.shape[dim] << " (" << shape_str(t) << ")";
    fail(name, os.str());
  }
}

void check_dtype(const char* name, const TensorView& t, DType expected, const char* why) {
  if (t.dtype != expected) {
    fail(name, std::string("expected dtype ") + dtype_name(expected) + " " + why + ", got " +
                   dtype_name(t.dtype));
  }
}

void check_device(const char* name, const TensorView& t, Device expected) {
  if (!(t.device == expected)) {
    fail(name, "expected device " + device_name(expected) + " (the device of q), got " +
                   device_name(t.device) + "; all tensors of a call must be on one device");
  }
}

// Byte range [lo, hi) a view can touch; empty views touch nothing.
struct Extent {
  std::uintptr_t lo = 0, hi = 0;
  bool empty() const { return hi <= lo; }
};

Extent extent_of(const TensorView& t) {
  if (!t.defined() || t.data == nullptr || t.numel() == 0) return {};
  std::int64_t lo = 0, hi = 0;
  for (int d = 0; d < t.rank; ++d) {
    const std::int64_t span = (t.shape[d] - 1) * t.stride[d];
    (span < 0 ? lo : hi) += span;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(t.data);
  const auto size = static_cast<std::int64_t>(dtype_size(t.dtype));
  return {base + static_cast<std::uintptr_t>(lo * size),
          base + static_cast<std::uintptr_t>((hi + 1) * size)};
}

struct Named {
  const char* name;
  const TensorView* view;
};

// Spans over caller arrays rather than vectors: validation runs on every call and allocates
// nothing unless it fails.
void check_no_alias(std::span<const Named> outputs, std::span<const Named> inputs) {
  for (std::size_t a = 0; a < outputs.size(); ++a) {
    const Extent ea = extent_of(*outputs[a].view);
    if (ea.empty()) continue;
    auto overlaps = [&](const Named& other) {
      if (!(other.view->device == outputs[a].view->device)) return false;
      const Extent eb = extent_of(*other.view);
      return !eb.empty() && ea.lo < eb.hi && eb.lo < ea.hi;
    };
    for (const Named& in : inputs) {
      if (overlaps(in)) {
        fail(outputs[a].name, std::string("output memory overlaps input `") + in.name +
                                  "`; outputs must not alias inputs");
      }
    }
    for (std::size_t b = a + 1; b < outputs.size(); ++b) {
      if (overlaps(outputs[b])) {
        fail(outputs[a].name, std::string("output memory overlaps output `") + outputs[b].name +
                                  "`; outputs must not alias each other");
      }
    }
  }
}

// An output whose elements share memory would be written twice in an order no backend defines.
// Sufficient for distinct elements (and what every dense or padded layout satisfies): taken by
// increasing |stride|, each dimension steps past everything the smaller ones reach.
void check_no_self_overlap(const char* name, const TensorView& t) {
  std::array<std::pair<std::int64_t, std::int64_t>, TensorView::kMaxRank> dims;  // (|stride|, size)
  std::size_t count = 0;  // dimensions of size > 1
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] > 1) dims[count++] = {t.stride[d] < 0 ? -t.stride[d] : t.stride[d], t.shape[d]};
  }
  for (std::size_t i = 1; i < count; ++i) {  // insertion sort: at most four entries
    for (std::size_t j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  }
  std::int64_t reach = 0;  // the largest offset the smaller dimensions add (check_view bounds it)
  for (std::size_t i = 0; i < count; ++i) {
    const auto [stride, size] = dims[i];
    if (stride <= reach) {
      fail(name, "output elements overlap in memory (" + shape_str(t) +
                     "); each element of an output needs its own memory");
    }
    reach += (size - 1) * stride;
  }
}

// 16-byte aligned start and 16-byte multiples for every stride but the last (size-1 dimensions
// are never stepped over, so their strides do not matter).
bool vector_aligned(const TensorView& t) {
  if (t.data == nullptr || t.numel() == 0) return true;
  if (reinterpret_cast<std::uintptr_t>(t.data) % kVectorBytes != 0) return false;
  const auto size = static_cast<std::int64_t>(dtype_size(t.dtype));
  for (int d = 0; d + 1 < t.rank; ++d) {
    if (t.shape[d] > 1 && (t.stride[d] * size) % kVectorBytes != 0) return false;
  }
  return true;
}

bool is_supported_dtype(DType d) {
  return d == DType::f32 || d == DType::f16 || d == DType::bf16 || d == DType::f64;
}

}  // namespace

std::string Problem::bias_pattern() const {
  if (!has_bias) return "none";
  std::string p = "bhqk";
  if (bias_bcast_b) p[0] = '1';
  if (bias_bcast_h) p[1] = '1';
  if (bias_bcast_q) p[2] = '1';
  return p;
}

std::string Problem::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << " B=" << B << " Hq=" << Hq << " Hkv=" << Hkv << " Lq=" << Lq
     << " Lk=" << Lk << " D=" << D << " Dv=" << Dv << " causal=" << causal_mode_name(causal)
     << " bias=" << bias_pattern() << " dropout=" << dropout_p;
  if (q_start != 0 || k_start != 0) os << " q_start=" << q_start << " k_start=" << k_start;
  if (kv_block) os << " kv_block";
  if (has_window()) os << " window=" << window_left << "," << window_right;
  if (has_alibi) os << " alibi=" << (alibi_per_batch ? "bh" : "h");
  if (has_softcap()) os << " softcap=" << softcap;
  os << " on " << device_name(device);
  return os.str();
}

std::vector<std::string> score_modifier_reasons(const Problem& p, const std::string& backend) {
  std::vector<std::string> reasons;
  const std::string missing = ": not in the " + backend + " kernels yet (docs/window.md)";
  if (p.has_window()) reasons.push_back("window" + missing);
  if (p.has_alibi) reasons.push_back("alibi_slopes" + missing);
  if (p.has_softcap()) reasons.push_back("softcap" + missing);
  return reasons;
}

namespace {

void check_offsets_view(const char* name, const TensorView& cu, const TensorView& q) {
  check_view(name, cu, 1);
  check_dtype(name, cu, DType::i32, "(sequence offsets)");
  check_device(name, cu, q.device);
  if (cu.shape[0] < 1) {
    fail(name, "expected S + 1 >= 1 entries (0 first, the total last), got " + shape_str(cu));
  }
}

// The sizes both layouts, dense [B, H, L, D] and packed [total, H, D], keep in the same places:
// the heads second, the head dim last.
void read_heads(const TensorView& q, const TensorView& k, const TensorView& v, Problem& p) {
  p.Hq = q.shape[1];
  p.D = q.shape[q.rank - 1];
  p.Hkv = k.shape[1];
  p.Dv = v.shape[v.rank - 1];
}

// The sizes of a packed call (PackedSequences); the offsets' values are checked separately
// (validate_packed_offsets), on the host or after a copy from the device.
Problem packed_problem(const AttentionArgs& args) {
  const PackedSequences& ps = *args.packed;
  check_view("q", args.q, 3);
  check_view("k", args.k, 3);
  check_view("v", args.v, 3);
  check_offsets_view("cu_seqlens_q", ps.cu_seqlens_q, args.q);
  check_offsets_view("cu_seqlens_k", ps.cu_seqlens_k, args.q);
  if (ps.cu_seqlens_k.shape[0] != ps.cu_seqlens_q.shape[0]) {
    fail("cu_seqlens_k", "expected " + std::to_string(ps.cu_seqlens_q.shape[0]) +
                             " entries (as cu_seqlens_q: S + 1), got " +
                             shape_str(ps.cu_seqlens_k));
  }
  const TensorView &q = args.q, &k = args.k, &v = args.v;
  Problem p;
  p.packed = true;
  p.B = ps.cu_seqlens_q.shape[0] - 1;
  read_heads(q, k, v, p);
  p.total_q = q.shape[0];
  p.total_k = k.shape[0];
  p.Lq = ps.max_seqlen_q;
  p.Lk = ps.max_seqlen_k;
  check_dim("k", k, 2, p.D, "(the head dim of q)");
  check_dim("v", v, 0, p.total_k, "(the packed keys of k)");
  check_dim("v", v, 1, p.Hkv, "(the heads of k)");
  if (ps.max_seqlen_q < 0 || ps.max_seqlen_q > std::max<std::int64_t>(p.total_q, 0)) {
    fail("max_seqlen_q", "expected a value in [0, total_q = " + std::to_string(p.total_q) +
                             "], got " + std::to_string(ps.max_seqlen_q));
  }
  if (ps.max_seqlen_k < 0 || ps.max_seqlen_k > p.total_k) {
    fail("max_seqlen_k", "expected a value in [0, total_k = " + std::to_string(p.total_k) +
                             "], got " + std::to_string(ps.max_seqlen_k));
  }
  if (p.total_q > std::numeric_limits<std::int32_t>::max() ||
      p.total_k > std::numeric_limits<std::int32_t>::max()) {
    fail(p.total_q > p.total_k ? "q" : "k",
         "packed tensors hold at most 2^31 - 1 rows (int32 offsets), got " + shape_str(
             p.total_q > p.total_k ? q : k));
  }
  if (args.bias) {
    fail("bias", "not supported with packed sequences (a per-sequence bias has no packed layout "
                 "here); pad the batch to pass a bias");
  }
  return p;
}

}  // namespace

void validate_packed_offsets(const std::int32_t* cu_q, const std::int32_t* cu_k,
                             const Problem& p) {
  const struct {
    const char* name;
    const std::int32_t* cu;
    std::int64_t total, max_len;
    const char* max_name;
  } sides[] = {{"cu_seqlens_q", cu_q, p.total_q, p.Lq, "max_seqlen_q"},
               {"cu_seqlens_k", cu_k, p.total_k, p.Lk, "max_seqlen_k"}};
  for (const auto& side : sides) {
    if (side.cu[0] != 0) fail(side.name, "expected 0 first, got " + std::to_string(side.cu[0]));
    for (std::int64_t s = 0; s < p.B; ++s) {
      const std::int64_t a = side.cu[s], b = side.cu[s + 1];
      if (b < a) {
        fail(side.name, "expected non-decreasing offsets, got " + std::to_string(b) +
                            " at entry " + std::to_string(s + 1) + " after " + std::to_string(a));
      }
      if (b - a > side.max_len) {
        fail(side.max_name, "sequence " + std::to_string(s) + " has length " +
                                std::to_string(b - a) + " (" + side.name + "), more than " +
                                side.max_name + " = " + std::to_string(side.max_len));
      }
    }
    if (side.cu[p.B] != side.total) {
      fail(side.name, "expected the packed rows' count " + std::to_string(side.total) +
                          " last, got " + std::to_string(side.cu[p.B]) + " at entry " +
                          std::to_string(p.B));
    }
  }
}

namespace {

Problem dense_problem(const AttentionArgs& args) {
  check_view("q", args.q, 4);
  check_view("k", args.k, 4);
  check_view("v", args.v, 4);
  const TensorView &q = args.q, &k = args.k, &v = args.v;
  Problem p;
  read_heads(q, k, v, p);
  p.B = q.shape[0];
  p.Lq = q.shape[2];
  p.Lk = k.shape[2];
  check_dim("k", k, 0, p.B, "(the batch of q)");
  check_dim("k", k, 3, p.D, "(the head dim of q)");
  check_dim("v", v, 0, p.B, "(the batch of q)");
  check_dim("v", v, 1, p.Hkv, "(the heads of k)");
  check_dim("v", v, 2, p.Lk, "(the keys of k)");
  return p;
}

// AttentionArgs::q_start, k_start and kv_block (docs/context_parallel.md): the global rows and
// keys must be addressable by the dropout map, and only top_left or no causal mask has a meaning
// for a slice of a larger attention.
void check_global_coordinates(const AttentionArgs& args, Problem& p) {
  if (!args.has_global_coordinates()) return;
  const struct {
    const char* name;
    std::int64_t start, length;
    std::uint64_t limit;
    const char* what;
  } sides[] = {{"q_start", args.q_start, p.Lq, detail::kDropoutMaxRows, "query rows"},
               {"k_start", args.k_start, p.Lk, detail::kDropoutMaxCols, "keys"}};
  for (const auto& side : sides) {
    if (side.start < 0) {
      fail(side.name, "expected a global position >= 0, got " + std::to_string(side.start));
    }
    // start + length <= limit, written so that it cannot overflow (both are below 2^63).
    if (static_cast<std::uint64_t>(side.start) > side.limit ||
        static_cast<std::uint64_t>(side.length) >
            side.limit - static_cast<std::uint64_t>(side.start)) {
      fail(side.name, std::string("global ") + side.what + " [" + std::to_string(side.start) +
                          ", " + std::to_string(side.start) + " + " + std::to_string(side.length) +
                          ") reach past the dropout map's " +
                          (side.limit == detail::kDropoutMaxRows ? "2^32 rows" : "2^36 keys"));
    }
  }
  if (args.packed) {
    fail(args.kv_block ? "kv_block" : (args.q_start != 0 ? "q_start" : "k_start"),
         "not supported with packed sequences (each sequence already has its own coordinates)");
  }
  if (args.causal == CausalMode::bottom_right) {
    fail("causal",
         "bottom_right is not defined with q_start/k_start/kv_block (its diagonal "
         "depends on the whole attention's lengths, which a slice does not know); for "
         "a square attention (Lq = Lk in total) pass top_left, the same mask");
  }
  p.q_start = args.q_start;
  p.k_start = args.k_start;
  p.kv_block = args.kv_block;
}

// AttentionArgs::window, alibi_slopes and softcap (docs/window.md). Needs the sizes, the causal
// mode and the global coordinates already in `p`.
void check_score_modifiers(const AttentionArgs& args, Problem& p) {
  const Window& w = args.window;
  for (const auto& [side, value] : {std::pair{"left", w.left}, std::pair{"right", w.right}}) {
    if (value < -1) {
      fail("window", std::string("expected ") + side +
                         " >= 0, or -1 for no bound on that side, got " + std::to_string(value));
    }
  }
  const bool alignment_needs_lengths = args.causal != CausalMode::top_left;
  if (w.bounded() && alignment_needs_lengths && args.has_global_coordinates()) {
    fail("window", std::string("with causal ") + causal_mode_name(args.causal) +
                       " the window aligns query i with key i + Lk - Lq, which a slice of a "
                       "larger attention (q_start/k_start/kv_block) does not know; pass top_left");
  }
  p.window_left = std::min(w.left, Problem::kWindowCap);
  p.window_right = std::min(w.right, Problem::kWindowCap);

  if (args.alibi_slopes) {
    const TensorView& s = *args.alibi_slopes;
    if (s.rank != 1 && s.rank != 2) {
      fail("alibi_slopes", "expected shape [Hq] or [B, Hq] (rank 1 or 2), got " +
                               (s.rank ? shape_str(s) : std::string("an undefined view")));
    }
    check_view("alibi_slopes", s, s.rank);
    check_dtype("alibi_slopes", s, DType::f32, "(slopes are fp32)");
    check_device("alibi_slopes", s, args.q.device);
    const bool per_batch = s.rank == 2;
    if (s.shape[s.rank - 1] != p.Hq || (per_batch && s.shape[0] != p.B)) {
      fail("alibi_slopes", "expected shape [Hq] = [" + std::to_string(p.Hq) + "] or [B, Hq] = [" +
                               std::to_string(p.B) + ", " + std::to_string(p.Hq) + "]" +
                               (args.packed ? " (B: the packed sequences)" : "") + ", got " +
                               shape_str(s));
    }
    if (alignment_needs_lengths && args.has_global_coordinates()) {
      fail("alibi_slopes", std::string("with causal ") + causal_mode_name(args.causal) +
                               " the distances count from key i + Lk - Lq, which a slice of a "
                               "larger attention (q_start/k_start/kv_block) does not know; pass "
                               "top_left");
    }
    p.has_alibi = true;
    p.alibi_per_batch = per_batch;
  }

  if (!std::isfinite(args.softcap) || args.softcap < 0.0) {
    fail("softcap", "expected a finite number >= 0 (0: off), got " + std::to_string(args.softcap));
  }
  p.softcap = args.softcap;
}

}  // namespace

Problem validate_inputs(const AttentionArgs& args) {
  Problem p = args.packed ? packed_problem(args) : dense_problem(args);
  const TensorView &q = args.q, &k = args.k, &v = args.v;
  if (!is_supported_dtype(q.dtype)) fail("q", "unsupported dtype");
  check_dtype("k", k, q.dtype, "(the dtype of q)");
  check_dtype("v", v, q.dtype, "(the dtype of q)");
  check_device("k", k, q.device);
  check_device("v", v, q.device);
  p.dtype = q.dtype;
  p.device = q.device;
  p.vector_aligned = vector_aligned(q) && vector_aligned(k) && vector_aligned(v);

  if (p.Hkv == 0 && p.Hq != 0) fail("k", "has 0 heads while q has " + std::to_string(p.Hq));
  if (p.Hkv > 0 && p.Hq % p.Hkv != 0) {
    fail("k", "expected a number of heads dividing the query heads (GQA/MQA), got Hkv = " +
                  std::to_string(p.Hkv) + " for Hq = " + std::to_string(p.Hq));
  }
  if (p.D == 0 && p.Lq > 0 && p.Lk > 0 && p.B * p.Hq > 0) fail("q", "head dim D must be >= 1, got 0");
  if (static_cast<std::uint64_t>(p.Lq) > detail::kDropoutMaxRows) {
    fail("q", "at most 2^32 query rows are supported, got " + std::to_string(p.Lq));
  }
  if (static_cast<std::uint64_t>(p.Lk) > detail::kDropoutMaxCols) {
    fail("k", "at most 2^36 keys are supported, got " + std::to_string(p.Lk));
  }

  if (args.bias) {
    const TensorView& bias = *args.bias;
    check_view("bias", bias, 4);
    if (bias.dtype != q.dtype && bias.dtype != DType::f32) {
      fail("bias", std::string("expected dtype ") + dtype_name(q.dtype) +
                       " (the dtype of q) or fp32, got " + dtype_name(bias.dtype));
    }
    check_device("bias", bias, q.device);
    const std::int64_t full[4] = {p.B, p.Hq, p.Lq, p.Lk};
    for (int d = 0; d < 4; ++d) {
      const bool broadcastable = bias.shape[d] == full[d] || (d < 3 && bias.shape[d] == 1);
      if (!broadcastable) {
        std::ostringstream os;
        os << "expected a shape broadcastable to [B, Hq, Lq, Lk] = [" << p.B << ", " << p.Hq
           << ", " << p.Lq << ", " << p.Lk << "] (size " << full[d]
           << (d < 3 ? " or 1" : "") << " in dimension " << d << "), got " << shape_str(bias);
        fail("bias", os.str());
      }
    }
    p.has_bias = true;
    p.bias_dtype = bias.dtype;
    p.bias_bcast_b = bias.shape[0] == 1 && p.B != 1;
    p.bias_bcast_h = bias.shape[1] == 1 && p.Hq != 1;
    p.bias_bcast_q = bias.shape[2] == 1 && p.Lq != 1;
  }

  if (args.scale) {
    if (!std::isfinite(*args.scale)) {
      fail("scale", "expected a finite number, got " + std::to_string(*args.scale));
    }
    p.scale = *args.scale;
  } else {
    p.scale = p.D > 0 ? 1.0 / std::sqrt(static_cast<double>(p.D)) : 1.0;
  }
  if (args.causal != CausalMode::none && args.causal != CausalMode::top_left &&
      args.causal != CausalMode::bottom_right) {
    fail("causal", "expected none, top_left or bottom_right");
  }
  p.causal = args.causal;
  p.dropout = dropout_threshold(args.dropout_p);  // names dropout_p on failure
  p.dropout_p = args.dropout_p;
  if ((args.rng.device_seed || args.rng.device_offset) && q.device.type != DeviceType::cuda) {
    fail("rng", "device_seed/device_offset point to device memory and need CUDA tensors; q is on " +
                    device_name(q.device));
  }
  check_global_coordinates(args, p);
  check_score_modifiers(args, p);
  if (args.packed && q.device.type == DeviceType::cpu) {  // host offsets: always checked
    validate_packed_offsets(static_cast<const std::int32_t*>(args.packed->cu_seqlens_q.data),
                            static_cast<const std::int32_t*>(args.packed->cu_seqlens_k.data), p);
  }
  return p;
}

namespace {

// out and lse as forward writes them: [B, Hq, Lq, Dv] and [B, Hq, Lq], or with packed sequences
// [total_q, Hq, Dv] and [Hq, total_q]; lse always fp32.
void check_outputs(const Problem& p, const TensorView& out, const TensorView& lse) {
  struct Size {
    std::int64_t value;
    const char* why;
  };
  const Size dense_out[] = {{p.B, "(the batch of q)"},
                            {p.Hq, "(the heads of q)"},
                            {p.Lq, "(the queries of q)"},
                            {p.Dv, "(the head dim of v)"}};
  const Size packed_out[] = {{p.total_q, "(the packed queries of q)"},
                             {p.Hq, "(the heads of q)"},
                             {p.Dv, "(the head dim of v)"}};
  const std::span<const Size> out_sizes = p.packed ? std::span<const Size>(packed_out) : dense_out;
  const int rank = static_cast<int>(out_sizes.size());
  check_view("out", out, rank);
  check_view("lse", lse, rank - 1);
  check_dtype("out", out, p.dtype, "(the dtype of q)");
  check_dtype("lse", lse, DType::f32, "(lse is always fp32)");
  check_device("out", out, p.device);
  check_device("lse", lse, p.device);
  for (int d = 0; d < rank; ++d) check_dim("out", out, d, out_sizes[d].value, out_sizes[d].why);
  if (p.packed) {
    if (lse.shape[0] != p.Hq || lse.shape[1] != p.total_q) {
      fail("lse", "expected shape [Hq, total_q] = [" + std::to_string(p.Hq) + ", " +
                      std::to_string(p.total_q) + "] for packed sequences, got " + shape_str(lse));
    }
  } else if (lse.shape[0] != p.B || lse.shape[1] != p.Hq || lse.shape[2] != p.Lq) {
    fail("lse", "expected shape [B, Hq, Lq] = [" + std::to_string(p.B) + ", " +
                    std::to_string(p.Hq) + ", " + std::to_string(p.Lq) + "], got " +
                    shape_str(lse));
  }
}

}  // namespace

Problem validate_forward(const AttentionArgs& args, const TensorView& out, const TensorView& lse) {
  Problem p = validate_inputs(args);
  check_outputs(p, out, lse);
  check_no_self_overlap("out", out);
  check_no_self_overlap("lse", lse);
  std::array<Named, 5> inputs = {{{"q", &args.q}, {"k", &args.k}, {"v", &args.v}}};
  std::size_t input_count = 3;
  if (args.bias) inputs[input_count++] = {"bias", &*args.bias};
  if (args.alibi_slopes) inputs[input_count++] = {"alibi_slopes", &*args.alibi_slopes};
  const std::array<Named, 2> outputs = {{{"out", &out}, {"lse", &lse}}};
  check_no_alias(outputs, std::span(inputs).first(input_count));
  p.vector_aligned = p.vector_aligned && vector_aligned(out);
  return p;
}

Problem validate_backward(const AttentionArgs& args, const BackwardTensors& g) {
  Problem p = validate_forward(args, g.out, g.lse);
  const int rank = p.packed ? 3 : 4;
  check_view("dout", g.dout, rank);
  check_view("dq", g.dq, rank);
  check_view("dk", g.dk, rank);
  check_view("dv", g.dv, rank);
  const struct {
    const char* name;
    const TensorView* t;
    const TensorView* like;
  } same_shape[] = {{"dout", &g.dout, &g.out}, {"dq", &g.dq, &args.q},
                    {"dk", &g.dk, &args.k},     {"dv", &g.dv, &args.v}};
  for (const auto& s : same_shape) {
    check_dtype(s.name, *s.t, p.dtype, "(the dtype of q)");
    check_device(s.name, *s.t, p.device);
    for (int d = 0; d < rank; ++d) {
      check_dim(s.name, *s.t, d, s.like->shape[d], "(as its forward tensor)");
    }
  }
  if (g.dbias && !args.bias) fail("dbias", "given, but the call has no bias");
  std::array<Named, 4> outputs = {
      {{"dq", &g.dq}, {"dk", &g.dk}, {"dv", &g.dv}, {"dbias", g.dbias ? &*g.dbias : nullptr}}};
  const std::size_t output_count = g.dbias ? 4 : 3;
  if (g.dbias) {
    const TensorView& db = *g.dbias;
    check_view("dbias", db, 4);
    check_dtype("dbias", db, args.bias->dtype, "(the dtype of bias)");
    check_device("dbias", db, p.device);
    for (int d = 0; d < 4; ++d) check_dim("dbias", db, d, args.bias->shape[d], "(the shape of bias)");
  }
  for (std::size_t i = 0; i < output_count; ++i) {
    check_no_self_overlap(outputs[i].name, *outputs[i].view);
  }
  std::array<Named, 8> inputs = {{{"q", &args.q},
                                  {"k", &args.k},
                                  {"v", &args.v},
                                  {"out", &g.out},
                                  {"lse", &g.lse},
                                  {"dout", &g.dout}}};
  std::size_t input_count = 6;
  if (args.bias) inputs[input_count++] = {"bias", &*args.bias};
  if (args.alibi_slopes) inputs[input_count++] = {"alibi_slopes", &*args.alibi_slopes};
  check_no_alias(std::span(outputs).first(output_count), std::span(inputs).first(input_count));
  p.vector_aligned = p.vector_aligned && vector_aligned(g.dout) && vector_aligned(g.dq) &&
                     vector_aligned(g.dk) && vector_aligned(g.dv);
  return p;
}

}  // namespace memeff
