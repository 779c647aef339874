// libFuzzer target over the argument space of forward() and backward(): ranks, sizes (small,
// zero, negative, huge), strides (zero, negative, overlapping), misaligned and null pointers,
// dtypes, devices, outputs aliasing inputs, bias shapes and broadcast patterns, dropout p (NaN,
// 1, negative), scale (NaN, inf), causal modes, packed sequences (offsets good and bad), global
// coordinates (q_start, k_start, kv_block), windows, ALiBi slopes and softcaps. Every input must
// either raise memeff::Error naming an argument, or run on the reference and cpu backends with
// results that agree; anything else (a crash, a sanitizer report, another exception, a
// disagreement) aborts. Problems stay
// tiny (at most kMaxElements per tensor) so each input runs in well under a millisecond.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/error.h"
#include "memeff/tensor.h"

namespace memeff {
namespace {

constexpr std::int64_t kMaxElements = 1 << 12;  // per tensor; larger problems are only validated

Problem problem;  // of the input being run, for the failure message

[[noreturn]] void fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "attention_fuzz: %s\n  problem: %s\n", what.c_str(),
               problem.describe().c_str());
  std::abort();
}

// Sizes: mostly small (so the call runs), sometimes zero, negative or beyond any allocation.
std::int64_t pick_size(FuzzedDataProvider& in) {
  static constexpr std::array<std::int64_t, 16> kSizes = {1,
                                                          1,
                                                          2,
                                                          2,
                                                          3,
                                                          4,
                                                          5,
                                                          8,
                                                          9,
                                                          17,
                                                          0,
                                                          0,
                                                          -1,
                                                          -7,
                                                          std::int64_t{1} << 33,
                                                          std::numeric_limits<std::int64_t>::max()};
  return in.PickValueInArray(kSizes);
}

std::int64_t pick_stride(FuzzedDataProvider& in, std::int64_t contiguous) {
  contiguous = std::min<std::int64_t>(contiguous, std::int64_t{1} << 40);  // no overflow below
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0:
      return 0;  // broadcast (overlapping when written)
    case 1:
      return -contiguous;  // walks backwards
    case 2:
      return contiguous > 1 ? contiguous - 1 : 2;  // rows overlap
    case 3:
      return contiguous * 2 + 1;  // gaps
    case 4:
      return std::numeric_limits<std::int64_t>::max() / 3;
    default:
      return in.ConsumeIntegral<std::int32_t>();
  }
}

// How one tensor departs from the well-formed view of its expected shape.
struct ViewSpec {
  DType dtype = DType::f32;
  Device device{};
  int rank = 0;
  std::array<std::int64_t, 4> shape{}, stride{};
  std::size_t misalign_bytes = 0;
  bool null_data = false;
  int alias_of = -1;  // index of another tensor whose memory this one uses
};

ViewSpec make_spec(FuzzedDataProvider& in, DType dtype, std::vector<std::int64_t> shape,
                   bool permuted, int tensors_so_far) {
  ViewSpec s;
  s.dtype = dtype;
  s.rank = static_cast<int>(shape.size());
  for (int d = 0; d < s.rank; ++d) s.shape[d] = shape[d];
  // Row-major, or [B, L, H, D] storage (swap H and L) for rank 4.
  std::array<int, 4> order = {0, 1, 2, 3};
  if (permuted && s.rank == 4) std::swap(order[1], order[2]);
  std::int64_t step = 1;
  for (int o = s.rank - 1; o >= 0; --o) {
    const int d = order[o];
    s.stride[d] = step;
    // Saturates: a huge view keeps huge strides without overflowing here.
    if (__builtin_mul_overflow(step, std::max<std::int64_t>(s.shape[d], 1), &step)) {
      step = std::numeric_limits<std::int64_t>::max();
    }
  }
  switch (in.ConsumeIntegralInRange(0, 19)) {
    case 0:
      s.rank = in.ConsumeIntegralInRange(-1, 6);
      break;
    case 1:
      s.shape[in.ConsumeIntegralInRange(0, 3)] = pick_size(in);
      break;
    case 2: {
      const int d = in.ConsumeIntegralInRange(0, 3);
      s.stride[d] = pick_stride(in, s.stride[d]);
      break;
    }
    case 3:
      s.misalign_bytes = in.ConsumeIntegralInRange<std::size_t>(1, 15);
      break;
    case 4:
      s.null_data = true;
      break;
    case 5:
      s.dtype = static_cast<DType>(in.ConsumeIntegral<std::uint8_t>() % 5);
      break;
    case 6:
      s.device = in.ConsumeBool() ? Device::cuda(in.ConsumeIntegralInRange(-1, 1))
                                  : Device{static_cast<DeviceType>(2), 0};
      break;
    case 7:
      if (tensors_so_far > 0) s.alias_of = in.ConsumeIntegralInRange(0, tensors_so_far - 1);
      break;
    default:
      break;  // well-formed
  }
  return s;
}

// Element offsets [lo, hi] a view addresses; nullopt when it is too large to allocate (or the
// arithmetic overflows), and then the call is only validated.
struct Span {
  std::int64_t lo = 0, hi = 0;
};
std::optional<Span> span_of(const ViewSpec& s) {
  if (s.rank < 0 || s.rank > 4) return Span{};
  Span span;
  std::int64_t count = 1;
  for (int d = 0; d < s.rank; ++d) {
    if (s.shape[d] <= 0) return Span{};
    if (__builtin_mul_overflow(count, s.shape[d], &count) || count > kMaxElements) {
      return std::nullopt;
    }
    std::int64_t reach = 0;
    if (__builtin_mul_overflow(s.shape[d] - 1, s.stride[d], &reach) ||
        std::abs(reach) > kMaxElements * 8) {
      return std::nullopt;
    }
    (reach < 0 ? span.lo : span.hi) += reach;
  }
  return span;
}

// Backing memory of every tensor of one call, laid out by the specs.
class Arena {
 public:
  // Views of every spec; a tensor too large to allocate gets a pointer that must never be read
  // (allocated(t) is false), so a call using it may only be validated.
  void build(const std::vector<ViewSpec>& specs) {
    views_.assign(specs.size(), TensorView{});
    storage_.assign(specs.size(), {});
    allocated_.assign(specs.size(), true);
    for (std::size_t t = 0; t < specs.size(); ++t) {
      const ViewSpec& s = specs[t];
      TensorView& v = views_[t];
      v.dtype = s.dtype;
      v.device = s.device;
      v.rank = s.rank;
      v.shape = s.shape;
      v.stride = s.stride;
      const std::optional<Span> span = span_of(s);
      const std::size_t elem = std::max<std::size_t>(dtype_size(s.dtype), 1);
      if (!span) {
        allocated_[t] = false;
        // Never dereferenced: validation must reject or the call is skipped.
        v.data = reinterpret_cast<void*>(std::uintptr_t{1} << 20);
      } else {
        const std::size_t bytes = static_cast<std::size_t>(span->hi - span->lo + 1) * elem + 16;
        storage_[t].assign(bytes / sizeof(double) + 2, 0.0);
        auto* base = reinterpret_cast<unsigned char*>(storage_[t].data());
        v.data = base + static_cast<std::size_t>(-span->lo) * elem + s.misalign_bytes;
      }
      // Shares the other tensor's memory where all of this view fits inside it (so filling
      // the inputs stays in bounds); validation must reject any output among them.
      // Only between tensors of one dtype: reinterpreting fp32 bytes as fp16 makes inputs
      // non-finite, where backends may differ (0·inf) without either being wrong.
      if (s.alias_of >= 0 && span && allocated_[s.alias_of] && !storage_[s.alias_of].empty() &&
          specs[s.alias_of].dtype == s.dtype) {
        auto* other = static_cast<unsigned char*>(views_[s.alias_of].data);
        auto* begin = reinterpret_cast<unsigned char*>(storage_[s.alias_of].data());
        auto* end = begin + storage_[s.alias_of].size() * sizeof(double);
        const std::int64_t below = -span->lo * static_cast<std::int64_t>(elem);
        const std::int64_t above = (span->hi + 1) * static_cast<std::int64_t>(elem);
        if (other != nullptr && other - begin >= below && end - other >= above) v.data = other;
      }
      if (s.null_data) v.data = nullptr;
    }
  }
  bool allocated(std::size_t t) const { return allocated_[t]; }
  TensorView& view(std::size_t t) { return views_[t]; }
  // Fills every element a view addresses with uniform values from `rng`, as its dtype.
  static void fill(const TensorView& v, std::mt19937& rng) {
    std::uniform_real_distribution<double> uniform(-2.0, 2.0);
    for_each_offset(v, [&](std::int64_t off) { detail::store_from_double(v, off, uniform(rng)); });
  }
  // Every element NaN, so that an element a backend does not write never passes.
  static void poison(const TensorView& v) {
    for_each_offset(v, [&](std::int64_t off) { detail::store_from_double(v, off, NAN); });
  }
  template <typename Fn>
  static void for_each_offset(const TensorView& v, Fn fn) {
    if (v.data == nullptr || v.rank < 1 || v.rank > 4) return;
    std::array<std::int64_t, 4> size = {1, 1, 1, 1};
    for (int d = 0; d < v.rank; ++d) size[d] = v.shape[d];
    for (std::int64_t a = 0; a < size[0]; ++a) {
      for (std::int64_t b = 0; b < size[1]; ++b) {
        for (std::int64_t c = 0; c < size[2]; ++c) {
          for (std::int64_t e = 0; e < size[3]; ++e) {
            std::int64_t off = a * v.stride[0];
            if (v.rank > 1) off += b * v.stride[1];
            if (v.rank > 2) off += c * v.stride[2];
            if (v.rank > 3) off += e * v.stride[3];
            fn(off);
          }
        }
      }
    }
  }

 private:
  std::vector<TensorView> views_;
  std::vector<std::vector<double>> storage_;
  std::vector<bool> allocated_;
};

// The argument names memeff's messages use ("argument `q`: ...").
void expect_named_argument(const Error& e) {
  const std::string what = e.what();
  if (e.code() != ErrorCode::invalid_argument || what.rfind("argument `", 0) != 0) {
    fuzz_fail(std::string("an error that names no argument (") + error_code_name(e.code()) +
              "): " + what);
  }
}

// max|a - b| <= atol + rtol·max|b| over every element a view addresses, NaN never passing
// unless both sides are the same non-finite value (lse = -inf for rows without keys).
void expect_close(const char* name, const TensorView& got, const TensorView& want, double rtol) {
  double max_ref = 0.0, max_err = 0.0;
  bool bad = false;
  std::string first_bad;
  Arena::for_each_offset(want, [&](std::int64_t off) {
    const double a = detail::load_as_double(got, off), b = detail::load_as_double(want, off);
    if (!std::isfinite(a) || !std::isfinite(b)) {
      if (!(a == b) && !bad) {
        first_bad = " (at element offset " + std::to_string(off) + ": cpu " + std::to_string(a) +
                    ", reference " + std::to_string(b) + ")";
      }
      bad = bad || !(a == b);
      return;
    }
    max_ref = std::max(max_ref, std::fabs(b));
    max_err = std::max(max_err, std::fabs(a - b));
  });
  if (bad || max_err > rtol * (1.0 + max_ref)) {
    fuzz_fail(std::string("cpu and reference disagree on ") + name + ": max|err| " +
              std::to_string(max_err) + ", max|ref| " + std::to_string(max_ref) + first_bad +
              " for " + want.describe());
  }
}

double rtol_of(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return 2e-2;
    case DType::bf16:
      return 8e-2;
    default:
      return 1e-3;
  }
}

// Runs a cpu-backend call; false when the backend declines the problem (unsupported, with its
// reasons: D > 512, say), which is allowed; the reference backend must run everything valid.
template <typename Call>
bool cpu_runs(Call call) {
  try {
    call();
    return true;
  } catch (const Error& e) {
    if (e.code() != ErrorCode::unsupported) throw;
    return false;
  }
}

enum Tensor : int { q, k, v, bias, out, lse, dout, dq, dk, dv, dbias, kTensorCount };

// One fuzz input: decode, validate-and-run on both backends, compare.
void run_one(FuzzedDataProvider& in) {
  problem = Problem{};
  const bool backward_pass = in.ConsumeBool();
  const std::int64_t B = pick_size(in), Hkv = pick_size(in), group = pick_size(in);
  const std::int64_t Lq = pick_size(in), Lk = pick_size(in), D = pick_size(in);
  const std::int64_t Dv = in.ConsumeBool() ? D : pick_size(in);
  std::int64_t Hq = 0;
  if (__builtin_mul_overflow(Hkv, group, &Hq)) Hq = group;
  const DType dtype =
      in.PickValueInArray({DType::f32, DType::f32, DType::f16, DType::bf16, DType::f64});
  const bool permuted = in.ConsumeBool();
  const bool with_bias = in.ConsumeBool();
  // Bias: each of B, H, Lq broadcast (size 1) or full; sometimes a wrong size.
  std::vector<std::int64_t> bias_shape = {in.ConsumeBool() ? 1 : B, in.ConsumeBool() ? 1 : Hq,
                                          in.ConsumeBool() ? 1 : Lq, Lk};
  const DType bias_dtype = in.ConsumeBool() ? DType::f32 : dtype;
  const bool with_dbias =
      with_bias ? in.ConsumeIntegralInRange(0, 7) != 0 : in.ConsumeIntegralInRange(0, 7) == 0;

  std::vector<std::vector<std::int64_t>> shapes = {
      {B, Hq, Lq, D},  {B, Hkv, Lk, D},  {B, Hkv, Lk, Dv}, bias_shape,
      {B, Hq, Lq, Dv}, {B, Hq, Lq},      {B, Hq, Lq, Dv},  {B, Hq, Lq, D},
      {B, Hkv, Lk, D}, {B, Hkv, Lk, Dv}, bias_shape};
  // Packed sequences (AttentionArgs::packed) in one input of four: up to four sequences of small
  // lengths, the tensors [total, H, D] and lse [Hq, total_q]; the offsets are sometimes wrong
  // (first entry, order, last entry, maxima, dtype, size) and must then be named.
  const bool packed_call = in.ConsumeIntegralInRange(0, 3) == 0;
  std::vector<std::int32_t> cu_q, cu_k;
  std::int64_t max_q = 0, max_k = 0;
  int cu_defect = 0;
  if (packed_call) {
    const int S = in.ConsumeIntegralInRange(0, 4);
    cu_q.assign(S + 1, 0);
    cu_k.assign(S + 1, 0);
    for (int s = 0; s < S; ++s) {
      const int lq = in.ConsumeIntegralInRange(0, 9), lk = in.ConsumeIntegralInRange(0, 9);
      cu_q[s + 1] = cu_q[s] + lq;
      cu_k[s + 1] = cu_k[s] + lk;
      max_q = std::max<std::int64_t>(max_q, lq);
      max_k = std::max<std::int64_t>(max_k, lk);
    }
    cu_defect = in.ConsumeIntegralInRange(0, 15);
    switch (cu_defect) {
      case 1: cu_q[0] = 1; break;
      case 2: cu_k.back() += 1; break;
      case 3: if (S > 1) std::swap(cu_q[1], cu_q[2]); break;
      case 4: max_q = max_q > 0 ? max_q - 1 : -1; break;
      case 5: max_k += 100; break;
      case 6: cu_k.push_back(cu_k.back()); break;  // S + 2 entries
      default: break;
    }
    const std::int64_t Tq = cu_q.back(), Tk = cu_k.back();
    shapes = {{Tq, Hq, D},  {Tk, Hkv, D},  {Tk, Hkv, Dv}, bias_shape,
              {Tq, Hq, Dv}, {Hq, Tq},      {Tq, Hq, Dv},  {Tq, Hq, D},
              {Tk, Hkv, D}, {Tk, Hkv, Dv}, bias_shape};
  }
  std::vector<ViewSpec> specs;
  for (int t = 0; t < kTensorCount; ++t) {
    const DType dt = t == lse ? DType::f32 : (t == bias || t == dbias) ? bias_dtype : dtype;
    specs.push_back(make_spec(in, dt, shapes[t], permuted, t));
  }
  AttentionArgs args;
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      args.scale = std::nan("");
      break;
    case 1:
      args.scale = std::numeric_limits<double>::infinity();
      break;
    case 2:
      args.scale = 0.0;
      break;
    case 3:
      args.scale = -0.75;
      break;
    default:
      break;  // 1/sqrt(D)
  }
  args.dropout_p = in.PickValueInArray<double>({0.0, 0.0, 0.1, 0.5, 0.999, 1.0, -0.1, NAN});
  args.causal = static_cast<CausalMode>(in.ConsumeIntegralInRange(0, 3));
  args.rng.seed = in.ConsumeIntegral<std::uint64_t>();
  args.rng.offset = in.ConsumeIntegral<std::uint64_t>();
  std::uint64_t device_word = 0;
  if (in.ConsumeIntegralInRange(0, 15) == 0) args.rng.device_seed = &device_word;

  Arena arena;
  arena.build(specs);
  std::vector<int> used = {q, k, v, out, lse};
  if (with_bias) used.push_back(bias);
  if (backward_pass) used.insert(used.end(), {dout, dq, dk, dv});
  if (backward_pass && with_dbias) used.push_back(dbias);
  bool runnable = true;
  for (int t : used) runnable = runnable && arena.allocated(t);
  Arena cpu_outputs;
  cpu_outputs.build(specs);  // the same layout again, for the cpu backend's outputs
  auto bind = [&](Arena& a, AttentionArgs& call, BackwardTensors& g, TensorView& o, TensorView& l) {
    call = args;
    call.q = arena.view(q);
    call.k = arena.view(k);
    call.v = arena.view(v);
    if (with_bias) call.bias = arena.view(bias);
    o = arena.view(out);
    l = arena.view(lse);
    g.dout = arena.view(dout);
    g.out = o;
    g.lse = l;
    g.dq = a.view(dq);
    g.dk = a.view(dk);
    g.dv = a.view(dv);
    if (with_dbias) g.dbias = a.view(dbias);
    if (!backward_pass) {  // forward: the outputs under test come from `a`
      o = a.view(out);
      l = a.view(lse);
    }
  };
  // Global coordinates (a context-parallel block call) in one input of four: starts small,
  // unaligned to the 64-key dropout blocks, negative or past the map's range; kv_block on or off.
  if (in.ConsumeIntegralInRange(0, 3) == 0) {
    args.q_start = in.PickValueInArray<std::int64_t>({0, 1, 5, 64, 130, -3, std::int64_t{1} << 32});
    args.k_start = in.PickValueInArray<std::int64_t>({0, 1, 63, 64, 200, -1, std::int64_t{1} << 36});
    args.kv_block = in.ConsumeBool();
  }
  // Window, ALiBi and softcap (docs/window.md) in one input of three: window sides from invalid
  // through zero-width to wider than any sequence, caps good and bad, slopes [Hq] or [B, Hq] or
  // of a wrong size, dtype or device. Slopes point at a small buffer: only small heads get them.
  std::vector<float> slopes(4096);
  for (std::size_t h = 0; h < slopes.size(); ++h) slopes[h] = 0.5f / static_cast<float>(1 + h % 7);
  if (in.ConsumeIntegralInRange(0, 2) == 0) {
    const std::int64_t sides[] = {-1, -1, 0, 1, 3, 37, 64, std::int64_t{1} << 50, -2};
    args.window = {in.PickValueInArray(sides), in.PickValueInArray(sides)};
    args.softcap = in.PickValueInArray<double>({0.0, 0.0, 0.5, 30.0, -1.0, NAN, INFINITY});
    // Room for B·(Hq + 1) slopes (a wrong size adds one head), computed without overflow.
    const std::int64_t room = static_cast<std::int64_t>(slopes.size());
    std::int64_t slope_count = 0;
    const bool small_heads = B >= 0 && Hq >= 0 && Hq < room &&
                             !__builtin_mul_overflow(B, Hq + 1, &slope_count) && slope_count <= room;
    if (in.ConsumeBool() && small_heads) {
      const bool per_batch = in.ConsumeBool();
      const std::int64_t wrong = in.ConsumeIntegralInRange(0, 7) == 0 ? 1 : 0;
      TensorView sv = per_batch ? TensorView::contiguous(slopes.data(), DType::f32, {B, Hq + wrong})
                                : TensorView::contiguous(slopes.data(), DType::f32, {Hq + wrong});
      if (in.ConsumeIntegralInRange(0, 7) == 0) sv.dtype = DType::f16;
      if (in.ConsumeIntegralInRange(0, 7) == 0) sv.device = Device::cuda(0);
      args.alibi_slopes = sv;
    }
  }
  AttentionArgs call;
  BackwardTensors grads;
  TensorView o, l;
  bind(arena, call, grads, o, l);
  if (packed_call) {
    PackedSequences ps;
    ps.cu_seqlens_q = TensorView::contiguous(cu_q.data(), DType::i32,
                                             {static_cast<std::int64_t>(cu_q.size())});
    ps.cu_seqlens_k = TensorView::contiguous(cu_k.data(), DType::i32,
                                             {static_cast<std::int64_t>(cu_k.size())});
    if (cu_defect == 7) ps.cu_seqlens_q.dtype = DType::f32;
    if (cu_defect == 8) ps.cu_seqlens_k.device = Device::cuda(0);
    ps.max_seqlen_q = max_q;
    ps.max_seqlen_k = max_k;
    args.packed = ps;
    call.packed = ps;
  }

  // Validation first: it must accept, or reject naming an argument.
  try {
    problem = backward_pass ? validate_backward(call, grads) : validate_forward(call, o, l);
  } catch (const Error& e) {
    expect_named_argument(e);
    return;
  }
  if (!runnable) return;  // valid, but too large to allocate here (Lk = 2^33 is a legal size)
  if (call.q.device.type != DeviceType::cpu || dtype == DType::f64) return;  // no cpu backend

  std::mt19937 rng(static_cast<unsigned>(args.rng.seed));
  auto is_used = [&](int t) { return std::find(used.begin(), used.end(), t) != used.end(); };
  for (int t : {q, k, v, bias, dout}) {
    if (is_used(t)) Arena::fill(arena.view(t), rng);
  }
  Options reference_only, cpu_only;
  reference_only.backends = {"reference"};
  cpu_only.backends = {"cpu"};
  try {
    if (backward_pass) {
      forward(call, grads.out, grads.lse, reference_only);  // the forward the backward reads
    }
    for (int t : {out, lse, dq, dk, dv, dbias}) {
      if (is_used(t) && (!backward_pass || t >= dq)) {
        Arena::poison(arena.view(t));
        Arena::poison(cpu_outputs.view(t));
      }
    }
    AttentionArgs cpu_call;
    BackwardTensors cpu_grads;
    TensorView cpu_o, cpu_l;
    bind(cpu_outputs, cpu_call, cpu_grads, cpu_o, cpu_l);
    if (backward_pass) {
      backward(call, grads, reference_only);
      if (!cpu_runs([&] { backward(cpu_call, cpu_grads, cpu_only); })) return;
      // 16-bit: the cpu backend takes D_i = rowsum(dO∘O) from the rounded O, which is
      // keep_scale (up to 256) times larger than the terms it cancels; the reference sums
      // exactly. The rounding error of O scales the bound.
      const bool narrow = dtype == DType::f16 || dtype == DType::bf16;
      const double tol = 2 * rtol_of(dtype) * (narrow ? problem.dropout.keep_scale : 1.0);
      expect_close("dq", cpu_grads.dq, grads.dq, tol);
      expect_close("dk", cpu_grads.dk, grads.dk, tol);
      expect_close("dv", cpu_grads.dv, grads.dv, tol);
      if (grads.dbias) {
        // A broadcast dbias element sums dS over the broadcast dims: its rounding error grows
        // with the number of terms while cancellation can leave the exact value near 0 (one
        // visible key gives dS = P·(Z - D) = 0 exactly, and the rounded O leaves a residue).
        const TensorView& db = *grads.dbias;
        const double terms = static_cast<double>(problem.B * problem.Hq * problem.Lq) /
                             static_cast<double>(std::max<std::int64_t>(
                                 1, db.shape[0] * db.shape[1] * db.shape[2]));
        expect_close("dbias", *cpu_grads.dbias, db, tol * std::sqrt(std::max(terms, 1.0)));
      }
    } else {
      forward(call, o, l, reference_only);
      if (!cpu_runs([&] { forward(cpu_call, cpu_o, cpu_l, cpu_only); })) return;
      expect_close("out", cpu_o, o, rtol_of(dtype));
      expect_close("lse", cpu_l, l, rtol_of(DType::f32));
    }
  } catch (const Error& e) {
    fuzz_fail(std::string("validated, then failed: ") + e.what());
  }
}

}  // namespace
}  // namespace memeff

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  memeff::run_one(in);
  return 0;
}
