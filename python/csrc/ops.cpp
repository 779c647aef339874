// The torch.ops.memeff operator library: schemas, the CPU kernels (device_kernels.h over the
// CPU's generator), and the device-independent drivers that turn torch tensors into
// memeff::TensorViews and run one memeff::PreparedCall per pass (one decision, the workspace from
// torch's allocator in between). The autograd kernel is in autograd.cpp; the fake (meta) kernels
// are registered from Python (memeff/torch). Per-operator headers (not ATen/ATen.h) keep this
// file quick to compile.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bindings.h"
#include "device_kernels.h"
#include "memeff/dispatch.h"
#include "memeff/dropout.h"

namespace memeff_torch {
namespace {

// The backend names of the latest forward and backward of the process, for tests and users who
// want to know which kernel ran ("" before the first call). Process-wide rather than per thread:
// autograd runs CUDA backwards on its own device threads.
std::mutex g_last_backend_mutex;
std::string g_last_forward_backend;
std::string g_last_backward_backend;

void remember_backend(std::string& slot, const std::string& name) {
  std::lock_guard<std::mutex> lock(g_last_backend_mutex);
  slot = name;
}

memeff::DType dtype_of(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return memeff::DType::f32;
    case at::kHalf: return memeff::DType::f16;
    case at::kBFloat16: return memeff::DType::bf16;
    case at::kDouble: return memeff::DType::f64;
    default:
      TORCH_CHECK_VALUE(false, "argument `", name,
                        "`: expected dtype float32, float16, bfloat16 or float64, got ",
                        t.scalar_type());
  }
}

// Decides the pass once, takes the workspace the chosen backend wants from torch's allocator
// (graph-capture aware on CUDA, so memeff allocates nothing behind torch's back) and runs it.
memeff::CallInfo run_prepared(memeff::PreparedCall call, const at::Tensor& like) {
  const std::size_t bytes = call.workspace_bytes();
  at::Tensor workspace;
  if (bytes > 0) {
    workspace = at::empty({static_cast<std::int64_t>(bytes)}, like.options().dtype(at::kByte));
  }
  return translate_errors([&] { return call.run(bytes ? workspace.data_ptr() : nullptr, bytes); });
}

// q, k and v of a dense call have 4 dimensions, of a packed call 3: `layout` names them.
void check_rank(const at::Tensor& t, const char* name, std::int64_t rank, const char* layout) {
  TORCH_CHECK_VALUE(t.dim() == rank, "argument `", name, "`: expected a ", layout, " tensor, got ",
                    t.dim(), " dimensions");
}

// The tensors of a call with their last dimension made contiguous (kept alive for its duration)
// and the memeff arguments viewing them. A dense call may have a bias; a packed one has offsets;
// either may have ALiBi slopes.
struct Inputs {
  at::Tensor q, k, v;
  std::optional<at::Tensor> bias;
  std::optional<at::Tensor> alibi_slopes;
  at::Tensor cu_seqlens_q, cu_seqlens_k;
  memeff::AttentionArgs args;

  void set_qkv(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in) {
    q = last_dim_contiguous(q_in);
    k = last_dim_contiguous(k_in);
    v = last_dim_contiguous(v_in);
    args.q = view_of(q, "q");
    args.k = view_of(k, "k");
    args.v = view_of(v, "v");
  }

  // The settings every call takes; the RNG state last (a device state must be on q's device).
  void set_settings(std::optional<double> scale, c10::string_view causal, double dropout_p,
                    const at::Tensor& rng_state, const at::Tensor& q_in) {
    args.scale = scale;
    args.causal = parse_causal(causal);
    args.dropout_p = dropout_p;
    args.rng = rng_of(rng_state, dropout_p, q_in);
  }

  // Window, ALiBi and softcap (docs/window.md); memeff validates them, naming each.
  void set_modifiers(const ScoreModifiers& modifiers) {
    args.window = {modifiers.window_left, modifiers.window_right};
    args.softcap = modifiers.softcap;
    if (modifiers.alibi_slopes && modifiers.alibi_slopes->defined()) {
      alibi_slopes = last_dim_contiguous(*modifiers.alibi_slopes);
      args.alibi_slopes = view_of(*alibi_slopes, "alibi_slopes");
    }
  }
};

Inputs inputs_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const std::optional<at::Tensor>& bias, const at::Tensor& rng_state,
                 double dropout_p, c10::string_view causal, std::optional<double> scale,
                 const BlockCoordinates& coords, const ScoreModifiers& modifiers) {
  check_rank(q, "q", 4, "[B, Hq, Lq, D]");
  check_rank(k, "k", 4, "[B, Hkv, Lk, D]");
  check_rank(v, "v", 4, "[B, Hkv, Lk, Dv]");
  Inputs in;
  in.set_qkv(q, k, v);
  if (bias && bias->defined()) {
    TORCH_CHECK_VALUE(bias->dim() == 4, "argument `bias`: expected 4 dimensions [B|1, Hq|1, "
                      "Lq|1, Lk], got ", bias->dim());
    in.bias = last_dim_contiguous(*bias);
    in.args.bias = view_of(*in.bias, "bias");
  }
  in.set_settings(scale, causal, dropout_p, rng_state, q);
  // memeff validates them (starts >= 0 and in the dropout map's range, no bottom_right) and
  // names the argument.
  in.args.q_start = coords.q_start;
  in.args.k_start = coords.k_start;
  in.args.kv_block = coords.kv_block;
  in.set_modifiers(modifiers);
  return in;
}

// torch.use_deterministic_algorithms(True) asks memeff for its deterministic (bitwise
// repeatable) backward, where the backend has one.
memeff::Options options_of(std::vector<std::string> backends, void* stream) {
  memeff::Options options;
  options.backends = std::move(backends);
  options.stream = stream;
  options.deterministic = at::globalContext().deterministicAlgorithms();
  return options;
}

// A call with nothing to attend or nothing to produce: the documented edge results without
// touching memeff (empty tensors may have null data pointers).
bool is_empty_problem(const at::Tensor& q, const at::Tensor& k) {
  return q.size(0) == 0 || q.size(1) == 0 || q.size(2) == 0 || k.size(2) == 0;
}

// A packed call's sequence offsets: int32, one dimension [S + 1], on the device of q (checked
// here so the message names the torch argument; the core checks the same of the view). A
// strided tensor is copied contiguous.
at::Tensor offsets_of(const at::Tensor& cu, const char* name, const at::Tensor& q) {
  TORCH_CHECK_VALUE(cu.scalar_type() == at::kInt, "argument `", name,
                    "`: expected an int32 tensor of S + 1 sequence offsets, got ",
                    cu.scalar_type());
  TORCH_CHECK_VALUE(cu.dim() == 1, "argument `", name,
                    "`: expected one dimension [S + 1] (0, the running totals, total last), got ",
                    cu.dim(), " dimensions ", cu.sizes());
  TORCH_CHECK_VALUE(cu.device() == q.device(), "argument `", name, "`: expected it on ", q.device(),
                    " (the device of q), got ", cu.device());
  return cu.contiguous();
}

memeff::TensorView offsets_view(const at::Tensor& cu) {
  memeff::TensorView view;
  view.data = cu.data_ptr();
  view.dtype = memeff::DType::i32;
  view.device = cu.is_cuda() ? memeff::Device::cuda(cu.get_device()) : memeff::Device::cpu();
  view.rank = 1;
  view.shape[0] = cu.size(0);
  view.stride[0] = 1;
  return view;
}

// The tensors of a packed call: q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]
// and the offsets.
Inputs packed_inputs_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                        std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
                        const at::Tensor& rng_state, double dropout_p, c10::string_view causal,
                        std::optional<double> scale, bool check_offsets,
                        const ScoreModifiers& modifiers) {
  check_rank(q, "q", 3, "packed [total_q, Hq, D]");
  check_rank(k, "k", 3, "packed [total_k, Hkv, D]");
  check_rank(v, "v", 3, "packed [total_k, Hkv, Dv]");
  Inputs in;
  in.cu_seqlens_q = offsets_of(cu_seqlens_q, "cu_seqlens_q", q);
  in.cu_seqlens_k = offsets_of(cu_seqlens_k, "cu_seqlens_k", q);
  in.set_qkv(q, k, v);
  memeff::PackedSequences packed;
  packed.cu_seqlens_q = offsets_view(in.cu_seqlens_q);
  packed.cu_seqlens_k = offsets_view(in.cu_seqlens_k);
  packed.max_seqlen_q = max_seqlen_q;
  packed.max_seqlen_k = max_seqlen_k;
  packed.check_offsets = check_offsets;
  in.args.packed = packed;
  in.set_settings(scale, causal, dropout_p, rng_state, q);
  in.set_modifiers(modifiers);
  return in;
}

// A packed call with no query row or no head: nothing for memeff to run (the tensors may have
// null data pointers).
bool is_empty_packed_problem(const at::Tensor& q) { return q.size(0) == 0 || q.size(1) == 0; }

}  // namespace

memeff::TensorView view_of(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.dim() >= 1 && t.dim() <= memeff::TensorView::kMaxRank, "argument `", name,
                    "`: expected 1 to 4 dimensions, got ", t.dim());
  memeff::TensorView view;
  view.data = t.data_ptr();
  view.dtype = dtype_of(t, name);
  if (t.is_cuda()) {
    view.device = memeff::Device::cuda(t.get_device());
  } else {
    TORCH_CHECK_VALUE(t.is_cpu(), "argument `", name, "`: expected a CPU or CUDA tensor, got ",
                      t.device());
    view.device = memeff::Device::cpu();
  }
  view.rank = static_cast<int>(t.dim());
  for (int d = 0; d < view.rank; ++d) {
    view.shape[d] = t.size(d);
    view.stride[d] = t.stride(d);
  }
  return view;
}

at::Tensor last_dim_contiguous(const at::Tensor& t) {
  if (t.dim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1) return t;
  return t.contiguous();
}

at::Tensor empty_in_layout_of(const at::Tensor& like, std::int64_t last) {
  // The dimensions before the last are ordered by like's strides: three for [B, H, L, D], two
  // for packed [total, H, D]. Larger is further out in memory; size-1 and broadcast dimensions
  // go outermost.
  const int n = static_cast<int>(like.dim()) - 1;
  TORCH_CHECK(n == 2 || n == 3, "memeff: empty_in_layout_of takes 3 or 4 dimensions, got ",
              like.dim());
  auto outerness = [&](int d) {
    return like.size(d) == 1 || like.stride(d) == 0 ? std::numeric_limits<std::int64_t>::max()
                                                    : like.stride(d);
  };
  std::array<int, 3> order = {0, 1, 2};  // like's dimensions, outermost first (n of them)
  for (int i = 1; i < n; ++i) {          // insertion sort, stable: ties keep the logical order
    for (int j = i; j > 0 && outerness(order[j]) > outerness(order[j - 1]); --j) {
      std::swap(order[j], order[j - 1]);
    }
  }
  const at::TensorOptions options = like.options();
  std::vector<std::int64_t> storage_sizes;
  bool identity = true;
  for (int i = 0; i < n; ++i) {
    storage_sizes.push_back(like.size(order[i]));
    identity = identity && order[i] == i;
  }
  storage_sizes.push_back(last);
  at::Tensor storage = at::empty(storage_sizes, options);
  if (identity) return storage;
  std::vector<std::int64_t> logical(n + 1, n);  // storage dimension of each logical one
  for (int i = 0; i < n; ++i) logical[order[i]] = i;
  return storage.permute(logical);
}

memeff::CausalMode parse_causal(c10::string_view causal) {
  const std::string_view name(causal.data(), causal.size());
  if (const std::optional<memeff::CausalMode> mode = memeff::causal_mode_from_name(name)) {
    return *mode;
  }
  using memeff::causal_mode_name;
  TORCH_CHECK_VALUE(false, "argument `causal`: expected \"",
                    causal_mode_name(memeff::CausalMode::none), "\", \"",
                    causal_mode_name(memeff::CausalMode::top_left), "\" or \"",
                    causal_mode_name(memeff::CausalMode::bottom_right), "\", got \"", name, "\"");
}

memeff::RngState rng_of(const at::Tensor& rng_state, double dropout_p, const at::Tensor& q) {
  memeff::RngState rng;
  // Not above 0 (NaN included): no state to read, and the core's validation names a p it refuses.
  if (!(dropout_p > 0.0)) return rng;
  TORCH_CHECK_VALUE(rng_state.defined(), "argument `rng_state`: dropout_p = ", dropout_p,
                    " needs the call's RNG state (an int64[2] tensor of seed and offset)");
  const at::Tensor& s = rng_state;
  TORCH_CHECK_VALUE(s.scalar_type() == at::kLong && s.numel() == 2 && s.is_contiguous(),
                    "argument `rng_state`: expected a contiguous int64 tensor of 2 elements "
                    "(seed, offset), got ", s.scalar_type(), " ", s.sizes());
  if (s.is_cpu()) {
    const std::int64_t* words = s.data_ptr<std::int64_t>();
    rng.seed = static_cast<std::uint64_t>(words[0]);
    rng.offset = static_cast<std::uint64_t>(words[1]);
    return rng;
  }
  TORCH_CHECK_VALUE(s.device() == q.device(), "argument `rng_state`: expected it on the CPU or on ",
                    q.device(), " (the device of q), got ", s.device());
  const auto* words = reinterpret_cast<const std::uint64_t*>(s.data_ptr<std::int64_t>());
  rng.device_seed = words;
  rng.device_offset = words + 1;
  return rng;
}

bool needs_draw(const std::optional<at::Tensor>& rng_state, double dropout_p) {
  return dropout_p > 0.0 && !(rng_state && rng_state->defined());
}

at::Tensor no_state() { return at::empty({0}, at::TensorOptions().dtype(at::kLong)); }

at::Tensor cpu_state(std::uint64_t seed, std::uint64_t offset) {
  at::Tensor state = at::empty({2}, at::TensorOptions().dtype(at::kLong));
  state.data_ptr<std::int64_t>()[0] = static_cast<std::int64_t>(seed);
  state.data_ptr<std::int64_t>()[1] = static_cast<std::int64_t>(offset);
  return state;
}

namespace {

// The forward both ops end with: one prepared decision writing out and lse, run on `like`'s
// device and stream. A call with nothing to compute (`empty`) is still validated (memeff names
// bad arguments), then gets the edge results: a row that sees no key gives out = 0 and
// lse = -inf.
std::tuple<at::Tensor, at::Tensor, at::Tensor> run_forward(const memeff::AttentionArgs& args,
                                                           bool empty, at::Tensor out,
                                                           at::Tensor lse, at::Tensor drawn,
                                                           std::vector<std::string> backends,
                                                           void* stream, const at::Tensor& like) {
  if (empty) {
    translate_errors([&] { memeff::validate_inputs(args); });
    out.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
    return {std::move(out), std::move(lse), std::move(drawn)};
  }
  memeff::PreparedCall call = translate_errors([&] {
    return memeff::PreparedCall::forward(args, view_of(out, "out"), view_of(lse, "lse"),
                                         options_of(std::move(backends), stream));
  });
  remember_backend(g_last_forward_backend, run_prepared(std::move(call), like).backend);
  return {std::move(out), std::move(lse), std::move(drawn)};
}

// The backward both ops end with: views of the gradients' tensors (dout and out with a
// contiguous last dimension), one prepared decision, run on `like`'s device and stream. An
// `empty` call is validated and its gradients are zero.
void run_backward(const memeff::AttentionArgs& args, bool empty, const at::Tensor& dout,
                  const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dq,
                  const at::Tensor& dk, const at::Tensor& dv, const at::Tensor* dbias,
                  std::vector<std::string> backends, void* stream, const at::Tensor& like) {
  if (empty) {
    translate_errors([&] { memeff::validate_inputs(args); });
    for (const at::Tensor* grad : {&dq, &dk, &dv, dbias}) {
      if (grad != nullptr) grad->zero_();
    }
    return;
  }
  const at::Tensor dout_c = last_dim_contiguous(dout);
  const at::Tensor out_c = last_dim_contiguous(out);
  memeff::BackwardTensors grads;
  grads.dout = view_of(dout_c, "dout");
  grads.out = view_of(out_c, "out");
  grads.lse = view_of(lse, "lse");
  grads.dq = view_of(dq, "dq");
  grads.dk = view_of(dk, "dk");
  grads.dv = view_of(dv, "dv");
  if (dbias != nullptr) grads.dbias = view_of(*dbias, "dbias");
  memeff::PreparedCall call = translate_errors([&] {
    return memeff::PreparedCall::backward(args, grads, options_of(std::move(backends), stream));
  });
  remember_backend(g_last_backward_backend, run_prepared(std::move(call), like).backend);
}

// The state a call reads: the caller's when given, else `drawn` (the forward's fresh one; an
// undefined tensor for the backward, which always has the forward's).
const at::Tensor& state_of(const std::optional<at::Tensor>& rng_state, const at::Tensor& drawn) {
  return rng_state && rng_state->defined() ? *rng_state : drawn;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_on(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& rng_state,
    at::Tensor drawn, double dropout_p, c10::string_view causal, std::optional<double> scale,
    std::vector<std::string> backends, const BlockCoordinates& coords,
    const ScoreModifiers& modifiers, void* stream) {
  const Inputs in = inputs_of(q, k, v, bias, state_of(rng_state, drawn), dropout_p, causal, scale,
                              coords, modifiers);
  at::Tensor out = empty_in_layout_of(q, v.size(3));
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  return run_forward(in.args, is_empty_problem(q, k), std::move(out), std::move(lse),
                     std::move(drawn), std::move(backends), stream, q);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_on(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& rng_state, double dropout_p, c10::string_view causal,
    std::optional<double> scale, bool bias_grad, std::vector<std::string> backends,
    const BlockCoordinates& coords, const ScoreModifiers& modifiers, void* stream) {
  const at::Tensor none;
  const Inputs in = inputs_of(q, k, v, bias, state_of(rng_state, none), dropout_p, causal, scale,
                              coords, modifiers);
  TORCH_CHECK_VALUE(!bias_grad || in.bias.has_value(),
                    "argument `bias_grad`: true, but the call has no bias");
  at::Tensor dq = empty_in_layout_of(q, q.size(3));
  at::Tensor dk = empty_in_layout_of(k, k.size(3));
  at::Tensor dv = empty_in_layout_of(v, v.size(3));
  at::Tensor dbias = bias_grad ? at::empty(in.bias->sizes(), in.bias->options())
                               : at::empty({0}, q.options());
  run_backward(in.args, is_empty_problem(q, k), dout, out, lse, dq, dk, dv,
               bias_grad ? &dbias : nullptr, std::move(backends), stream, q);
  return {dq, dk, dv, dbias};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_forward_on(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
    const std::optional<at::Tensor>& rng_state, at::Tensor drawn, double dropout_p,
    c10::string_view causal, std::optional<double> scale, std::vector<std::string> backends,
    bool check_offsets, const ScoreModifiers& modifiers, void* stream) {
  const Inputs in = packed_inputs_of(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k, state_of(rng_state, drawn), dropout_p, causal,
                                     scale, check_offsets, modifiers);
  at::Tensor out = empty_in_layout_of(q, v.size(2));
  at::Tensor lse = at::empty({q.size(1), q.size(0)}, q.options().dtype(at::kFloat));
  return run_forward(in.args, is_empty_packed_problem(q), std::move(out), std::move(lse),
                     std::move(drawn), std::move(backends), stream, q);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_backward_on(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, std::int64_t max_seqlen_q,
    std::int64_t max_seqlen_k, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& rng_state, double dropout_p, c10::string_view causal,
    std::optional<double> scale, std::vector<std::string> backends,
    const ScoreModifiers& modifiers, void* stream) {
  // The forward checked the offsets when asked to; the backward never synchronizes for them.
  const at::Tensor none;
  const Inputs in = packed_inputs_of(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k, state_of(rng_state, none), dropout_p, causal,
                                     scale, /*check_offsets=*/false, modifiers);
  at::Tensor dq = empty_in_layout_of(q, q.size(2));
  at::Tensor dk = empty_in_layout_of(k, k.size(2));
  at::Tensor dv = empty_in_layout_of(v, v.size(2));
  run_backward(in.args, is_empty_packed_problem(q), dout, out, lse, dq, dk, dv, nullptr,
               std::move(backends), stream, q);
  return {dq, dk, dv};
}

namespace {

// Seed and offset for a CPU call, drawn from torch's CPU generator (the default one unless the
// caller passes its own), so torch.manual_seed decides the mask.
at::Tensor draw_cpu_state(const std::optional<at::Generator>& generator) {
  auto* gen = at::get_generator_or_default<at::CPUGeneratorImpl>(
      generator, at::detail::getDefaultCPUGenerator());
  std::uint64_t seed = 0, offset = 0;
  {
    std::lock_guard<std::mutex> lock(gen->mutex_);
    seed = gen->random64();
    offset = gen->random64();
  }
  return cpu_state(seed, offset);
}

// DeviceKernels' CPU side: nothing to guard, no stream, and the dropout state drawn from torch's
// CPU generator; every tensor of a CPU call is on the CPU (the dispatcher saw no other device).
struct CpuDevice {
  struct Guard {
    explicit Guard(c10::Device /*device*/) {}
  };
  static void* stream(const at::Tensor& /*q*/) { return nullptr; }
  static at::Tensor draw_state(const at::Tensor& /*q*/,
                               const std::optional<at::Generator>& generator) {
    return draw_cpu_state(generator);
  }
  static void check_packed_devices(const at::Tensor& /*q*/, const at::Tensor& /*k*/,
                                   const at::Tensor& /*v*/, const at::Tensor& /*cu_seqlens_q*/,
                                   const at::Tensor& /*cu_seqlens_k*/,
                                   const std::optional<at::Tensor>& /*rng_state*/) {}
};

using CpuKernels = DeviceKernels<CpuDevice>;

// The 0/1 keep decisions of a call with this RNG state, as a bool [B, H, Lq, Lk] CPU tensor.
at::Tensor dropout_mask_cpu(const at::Tensor& rng_state, at::IntArrayRef shape, double dropout_p) {
  TORCH_CHECK_VALUE(shape.size() == 4, "argument `shape`: expected [B, Hq, Lq, Lk], got ", shape);
  for (const std::int64_t s : shape) {
    TORCH_CHECK_VALUE(s >= 0, "argument `shape`: expected non-negative sizes, got ", shape);
  }
  TORCH_CHECK_VALUE(rng_state.scalar_type() == at::kLong && rng_state.numel() == 2,
                    "argument `rng_state`: expected an int64 tensor of 2 elements, got ",
                    rng_state.scalar_type(), " ", rng_state.sizes());
  const at::Tensor s = rng_state.contiguous();
  const auto seed = static_cast<std::uint64_t>(s.data_ptr<std::int64_t>()[0]);
  const auto offset = static_cast<std::uint64_t>(s.data_ptr<std::int64_t>()[1]);
  at::Tensor keep = at::empty(shape, at::TensorOptions().dtype(at::kByte));
  if (keep.numel() == 0) return keep.to(at::kBool);
  memeff::MaskWindow window;
  window.heads = shape[1];
  window.batch_count = shape[0];
  window.head_count = shape[1];
  window.rows = shape[2];
  window.cols = shape[3];
  translate_errors([&] {
    memeff::dropout_mask(seed, offset, dropout_p, window, keep.data_ptr<std::uint8_t>());
  });
  return keep.to(at::kBool);
}

std::tuple<std::int64_t, double, double> dropout_threshold_op(double dropout_p) {
  return translate_errors([&] {
    const memeff::DropoutThreshold t = memeff::dropout_threshold(dropout_p);
    return std::tuple<std::int64_t, double, double>(t.threshold, t.p_effective, t.keep_scale);
  });
}

std::vector<std::string> last_backends_op() {
  std::lock_guard<std::mutex> lock(g_last_backend_mutex);
  return {g_last_forward_backend, g_last_backward_backend};
}

std::string version_op() { return memeff::version(); }

std::vector<std::string> backend_names_op() { return memeff::backend_names(); }

// The names `causal` takes, memeff's one spelling of each mode (for the Python checks).
std::vector<std::string> causal_modes_op() {
  std::vector<std::string> names;
  for (const memeff::CausalMode mode :
       {memeff::CausalMode::none, memeff::CausalMode::top_left, memeff::CausalMode::bottom_right}) {
    names.emplace_back(memeff::causal_mode_name(mode));
  }
  return names;
}

}  // namespace
}  // namespace memeff_torch

TORCH_LIBRARY(memeff, m) {
  m.set_python_module("memeff.torch");
  // Attention forward: out [B, Hq, Lq, Dv] in q's memory layout, lse [B, Hq, Lq] (fp32) and
  // the (seed, offset) it drew. With dropout and no `rng_state` it draws a fresh pair from
  // `generator` (default: the device's default generator) and returns it as an int64[2] tensor:
  // on the CPU (values), or on the device under CUDA-graph capture (written when the graph
  // runs). Otherwise the third output is an empty int64 tensor.
  //
  // The keyword-only q_start, k_start and kv_block place the call in a larger attention
  // (memeff::AttentionArgs, docs/context_parallel.md): query row i is row q_start + i and key j
  // key k_start + j of the whole attention, for the dropout mask and for top_left causal
  // masking; kv_block marks the keys as one block of the whole attention's (the forward is
  // unchanged; see bwd). The defaults are an ordinary call. Backends that do not implement them
  // (the CUDA kernels, for now) refuse calls that set them.
  //
  // The keyword-only window_left, window_right, alibi_slopes and softcap change the scores
  // (memeff::AttentionArgs::window, alibi_slopes, softcap; docs/window.md): a sliding window
  // around each query's diagonal (-1: unbounded side), ALiBi slopes (fp32 [Hq] or [B, Hq]; no
  // gradient) and a tanh softcap (0: off). The defaults change nothing; the CUDA kernels refuse
  // them for now, with their reasons. Every op of the family takes them, the backwards the
  // forward's.
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor? rng_state, float dropout_p, "
      "str causal, float? scale, str[] backends, Generator? generator=None, *, int q_start=0, "
      "int k_start=0, bool kv_block=False, int window_left=-1, int window_right=-1, "
      "Tensor? alibi_slopes=None, float softcap=0.) -> (Tensor out, Tensor lse, Tensor rng_state)",
      {at::Tag::nondeterministic_seeded});
  // Attention backward: dq, dk, dv in the layouts of q, k, v and dbias (an empty [0] tensor
  // unless bias_grad); rng_state is the forward's (on the CPU or the device). q_start, k_start
  // as for fwd; with kv_block, `out` and `lse` are the *whole* attention's (its rows of them)
  // and the results are this key block's share of the gradients, summed over the blocks by the
  // caller (FlashAttention-2's backward; the single-key dS = 0 shortcut is off).
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor out, Tensor lse, "
      "Tensor? rng_state, float dropout_p, str causal, float? scale, bool bias_grad, "
      "str[] backends, *, int q_start=0, int k_start=0, bool kv_block=False, "
      "int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, float softcap=0.) -> "
      "(Tensor dq, Tensor dk, Tensor dv, Tensor dbias)");
  // Packed variable-length sequences (memeff::PackedSequences): q [total_q, Hq, D],
  // k [total_k, Hkv, D], v [total_k, Hkv, Dv], int32 offsets [S + 1] on the device of q.
  // out [total_q, Hq, Dv] in q's memory layout, lse [Hq, total_q] fp32, and the drawn state as
  // for fwd. The maximum lengths are SymInts: they shape no output, so torch.compile keeps them
  // symbolic. check_offsets: read the offsets' values and check them (on CUDA a copy to the host
  // and a synchronization, skipped while the stream captures a graph; on the CPU always). The
  // score modifiers as for fwd, alibi_slopes [Hq] or [S, Hq] (per sequence).
  m.def(
      "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
      "SymInt max_seqlen_q, SymInt max_seqlen_k, Tensor? rng_state, float dropout_p, str causal, "
      "float? scale, str[] backends, bool check_offsets, Generator? generator=None, *, "
      "int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, float softcap=0.) -> "
      "(Tensor out, Tensor lse, Tensor rng_state)",
      {at::Tag::nondeterministic_seeded});
  // Its backward: dq, dk, dv in the layouts of q, k, v. It never reads the offsets on the host.
  m.def(
      "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, Tensor out, Tensor lse, "
      "Tensor? rng_state, float dropout_p, str causal, float? scale, str[] backends, *, "
      "int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, float softcap=0.) -> "
      "(Tensor dq, Tensor dk, Tensor dv)");
  m.def("dropout_mask(Tensor rng_state, int[] shape, float dropout_p) -> Tensor");
  // A fresh (seed, offset) as fwd draws it with dropout and no rng_state, from `generator` (the
  // default generator of like's device when None): the int64[2] state on the CPU, or on the
  // device under CUDA-graph capture. `like` only selects the device.
  m.def("draw_rng_state(Tensor like, Generator? generator=None) -> Tensor",
        {at::Tag::nondeterministic_seeded});
  m.def("dropout_threshold(float dropout_p) -> (int, float, float)",
        &memeff_torch::dropout_threshold_op);
  m.def("last_backends() -> str[]", &memeff_torch::last_backends_op);
  m.def("version() -> str", &memeff_torch::version_op);
  m.def("backend_names() -> str[]", &memeff_torch::backend_names_op);
  m.def("causal_modes() -> str[]", &memeff_torch::causal_modes_op);
}

TORCH_LIBRARY_IMPL(memeff, CPU, m) {
  m.impl("fwd", &memeff_torch::CpuKernels::fwd);
  m.impl("bwd", &memeff_torch::CpuKernels::bwd);
  m.impl("varlen_fwd", &memeff_torch::CpuKernels::varlen_fwd);
  m.impl("varlen_bwd", &memeff_torch::CpuKernels::varlen_bwd);
  m.impl("dropout_mask", &memeff_torch::dropout_mask_cpu);
  m.impl("draw_rng_state", &memeff_torch::CpuKernels::draw_rng_state);
}
