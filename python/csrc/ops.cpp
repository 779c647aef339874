// The torch.ops.memeff operator library: schemas, the CPU kernels, and the device-independent
// drivers that turn torch tensors into memeff::TensorViews and call memeff::forward/backward.
// Autograd and the fake (meta) kernels are registered from Python (memeff/torch.py).
// Per-operator headers (not ATen/ATen.h) keep this file quick to compile.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>

#include "bindings.h"
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

memeff::Options options_of(const std::vector<std::string>& backends, void* stream) {
  memeff::Options options;
  options.backends = backends;
  options.stream = stream;
  return options;
}

// Scratch for the pass from torch's allocator (graph-capture aware on CUDA), so memeff does not
// allocate behind torch's back. The tensor must outlive the call; the caller keeps it.
at::Tensor workspace_for(const memeff::AttentionArgs& args, memeff::Pass pass,
                         memeff::Options& options, const at::Tensor& like) {
  const std::size_t bytes = memeff::workspace_size(args, pass, options);
  if (bytes == 0) return {};
  at::Tensor workspace =
      at::empty({static_cast<std::int64_t>(bytes)}, like.options().dtype(at::kByte));
  options.workspace = workspace.data_ptr();
  options.workspace_bytes = bytes;
  return workspace;
}

struct Prepared {
  at::Tensor q, k, v;
  std::optional<at::Tensor> bias;
  memeff::AttentionArgs args;
};

Prepared prepare(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& rng_state,
                 double dropout_p, const std::string& causal, std::optional<double> scale) {
  TORCH_CHECK_VALUE(q.dim() == 4, "argument `q`: expected a [B, Hq, Lq, D] tensor, got ",
                    q.dim(), " dimensions");
  TORCH_CHECK_VALUE(k.dim() == 4, "argument `k`: expected a [B, Hkv, Lk, D] tensor, got ",
                    k.dim(), " dimensions");
  TORCH_CHECK_VALUE(v.dim() == 4, "argument `v`: expected a [B, Hkv, Lk, Dv] tensor, got ",
                    v.dim(), " dimensions");
  Prepared p;
  p.q = last_dim_contiguous(q);
  p.k = last_dim_contiguous(k);
  p.v = last_dim_contiguous(v);
  p.args.q = view_of(p.q, "q");
  p.args.k = view_of(p.k, "k");
  p.args.v = view_of(p.v, "v");
  if (bias && bias->defined()) {
    TORCH_CHECK_VALUE(bias->dim() == 4, "argument `bias`: expected 4 dimensions [B|1, Hq|1, "
                      "Lq|1, Lk], got ", bias->dim());
    p.bias = last_dim_contiguous(*bias);
    p.args.bias = view_of(*p.bias, "bias");
  }
  p.args.scale = scale;
  p.args.causal = parse_causal(causal);
  p.args.dropout_p = dropout_p;
  p.args.rng = rng_of(rng_state, dropout_p, q);
  return p;
}

// A call with nothing to attend or nothing to produce: the documented edge results without
// touching memeff (empty tensors may have null data pointers).
bool is_empty_problem(const at::Tensor& q, const at::Tensor& k) {
  return q.size(0) == 0 || q.size(1) == 0 || q.size(2) == 0 || k.size(2) == 0;
}

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

memeff::CausalMode parse_causal(const std::string& causal) {
  if (causal == "none") return memeff::CausalMode::none;
  if (causal == "top_left") return memeff::CausalMode::top_left;
  if (causal == "bottom_right") return memeff::CausalMode::bottom_right;
  TORCH_CHECK_VALUE(false, "argument `causal`: expected \"none\", \"top_left\" or "
                    "\"bottom_right\", got \"", causal, "\"");
}

memeff::RngState rng_of(const std::optional<at::Tensor>& rng_state, double dropout_p,
                        const at::Tensor& q) {
  memeff::RngState rng;
  if (dropout_p == 0.0) return rng;
  TORCH_CHECK_VALUE(rng_state.has_value() && rng_state->defined(),
                    "argument `rng_state`: dropout_p = ", dropout_p,
                    " needs the call's RNG state (an int64[2] tensor of seed and offset)");
  const at::Tensor& s = *rng_state;
  TORCH_CHECK_VALUE(s.scalar_type() == at::kLong && s.numel() == 2 && s.is_contiguous(),
                    "argument `rng_state`: expected a contiguous int64 tensor of 2 elements "
                    "(seed, offset), got ", s.scalar_type(), " ", s.sizes());
  TORCH_CHECK_VALUE(s.device() == q.device(), "argument `rng_state`: expected it on ", q.device(),
                    " (the device of q), got ", s.device());
  if (s.is_cuda()) {
    const auto* words = reinterpret_cast<const std::uint64_t*>(s.data_ptr<std::int64_t>());
    rng.device_seed = words;
    rng.device_offset = words + 1;
  } else {
    const std::int64_t* words = s.data_ptr<std::int64_t>();
    rng.seed = static_cast<std::uint64_t>(words[0]);
    rng.offset = static_cast<std::uint64_t>(words[1]);
  }
  return rng;
}

std::tuple<at::Tensor, at::Tensor> forward_on(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v,
                                              const std::optional<at::Tensor>& bias,
                                              const std::optional<at::Tensor>& rng_state,
                                              double dropout_p, const std::string& causal,
                                              std::optional<double> scale,
                                              const std::vector<std::string>& backends,
                                              void* stream) {
  Prepared p = prepare(q, k, v, bias, rng_state, dropout_p, causal, scale);
  const std::int64_t B = q.size(0), Hq = q.size(1), Lq = q.size(2), Dv = v.size(3);
  at::Tensor out = at::empty({B, Hq, Lq, Dv}, q.options());
  at::Tensor lse = at::empty({B, Hq, Lq}, q.options().dtype(at::kFloat));
  if (is_empty_problem(q, k)) {
    // Validation still runs (memeff names bad arguments); then the edge semantics: a row that
    // sees no key gives out = 0 and lse = -inf.
    translate_errors([&] { memeff::validate_inputs(p.args); });
    out.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  translate_errors([&] {
    memeff::Options options = options_of(backends, stream);
    at::Tensor workspace = workspace_for(p.args, memeff::Pass::forward, options, q);
    const memeff::CallInfo info =
        memeff::forward(p.args, view_of(out, "out"), view_of(lse, "lse"), options);
    remember_backend(g_last_forward_backend, info.backend);
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_on(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& rng_state, double dropout_p, const std::string& causal,
    std::optional<double> scale, bool bias_grad, const std::vector<std::string>& backends,
    void* stream) {
  Prepared p = prepare(q, k, v, bias, rng_state, dropout_p, causal, scale);
  TORCH_CHECK_VALUE(!bias_grad || p.bias.has_value(),
                    "argument `bias_grad`: true, but the call has no bias");
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(k.sizes(), k.options());
  at::Tensor dv = at::empty(v.sizes(), v.options());
  at::Tensor dbias = bias_grad ? at::empty(p.bias->sizes(), p.bias->options())
                               : at::empty({0}, q.options());
  if (is_empty_problem(q, k)) {
    translate_errors([&] { memeff::validate_inputs(p.args); });
    dq.zero_();
    dk.zero_();
    dv.zero_();
    dbias.zero_();
    return {dq, dk, dv, dbias};
  }
  const at::Tensor dout_c = last_dim_contiguous(dout);
  const at::Tensor out_c = last_dim_contiguous(out);
  translate_errors([&] {
    memeff::BackwardTensors grads;
    grads.dout = view_of(dout_c, "dout");
    grads.out = view_of(out_c, "out");
    grads.lse = view_of(lse, "lse");
    grads.dq = view_of(dq, "dq");
    grads.dk = view_of(dk, "dk");
    grads.dv = view_of(dv, "dv");
    if (bias_grad) grads.dbias = view_of(dbias, "dbias");
    memeff::Options options = options_of(backends, stream);
    at::Tensor workspace = workspace_for(p.args, memeff::Pass::backward, options, q);
    const memeff::CallInfo info = memeff::backward(p.args, grads, options);
    remember_backend(g_last_backward_backend, info.backend);
  });
  return {dq, dk, dv, dbias};
}

namespace {

std::tuple<at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v,
                                           const std::optional<at::Tensor>& bias,
                                           const std::optional<at::Tensor>& rng_state,
                                           double dropout_p, c10::string_view causal,
                                           std::optional<double> scale,
                                           std::vector<std::string> backends) {
  return forward_on(q, k, v, bias, rng_state, dropout_p, std::string(causal), scale, backends,
                    nullptr);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bwd_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& rng_state, double dropout_p, c10::string_view causal,
    std::optional<double> scale, bool bias_grad, std::vector<std::string> backends) {
  return backward_on(dout, q, k, v, bias, out, lse, rng_state, dropout_p, std::string(causal),
                     scale, bias_grad, backends, nullptr);
}

// Seed and offset for a CPU call, drawn from torch's CPU generator (the default one unless the
// caller passes its own), so torch.manual_seed decides the mask.
at::Tensor draw_rng_state_cpu(const at::Tensor& like, std::optional<at::Generator> generator) {
  auto* gen = at::get_generator_or_default<at::CPUGeneratorImpl>(
      generator, at::detail::getDefaultCPUGenerator());
  std::uint64_t seed = 0, offset = 0;
  {
    std::lock_guard<std::mutex> lock(gen->mutex_);
    seed = gen->random64();
    offset = gen->random64();
  }
  at::Tensor state = at::empty({2}, like.options().dtype(at::kLong));
  state.data_ptr<std::int64_t>()[0] = static_cast<std::int64_t>(seed);
  state.data_ptr<std::int64_t>()[1] = static_cast<std::int64_t>(offset);
  return state;
}

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

}  // namespace
}  // namespace memeff_torch

TORCH_LIBRARY(memeff, m) {
  m.set_python_module("memeff.torch");
  // Attention forward: out [B, Hq, Lq, Dv] and lse [B, Hq, Lq] (fp32). `rng_state` is the
  // int64[2] (seed, offset) of draw_rng_state; it may be None when dropout_p is 0.
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor? rng_state, float dropout_p, "
      "str causal, float? scale, str[] backends) -> (Tensor out, Tensor lse)");
  // Attention backward: dq, dk, dv and dbias (an empty [0] tensor unless bias_grad).
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor out, Tensor lse, "
      "Tensor? rng_state, float dropout_p, str causal, float? scale, bool bias_grad, "
      "str[] backends) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dbias)");
  // A fresh (seed, offset) from torch's generator for the device of `like`.
  m.def("draw_rng_state(Tensor like, Generator? generator=None) -> Tensor",
        {at::Tag::nondeterministic_seeded});
  m.def("dropout_mask(Tensor rng_state, int[] shape, float dropout_p) -> Tensor");
  m.def("dropout_threshold(float dropout_p) -> (int, float, float)",
        &memeff_torch::dropout_threshold_op);
  m.def("last_backends() -> str[]", &memeff_torch::last_backends_op);
  m.def("version() -> str", &memeff_torch::version_op);
  m.def("backend_names() -> str[]", &memeff_torch::backend_names_op);
}

TORCH_LIBRARY_IMPL(memeff, CPU, m) {
  m.impl("fwd", &memeff_torch::fwd_cpu);
  m.impl("bwd", &memeff_torch::bwd_cpu);
  m.impl("draw_rng_state", &memeff_torch::draw_rng_state_cpu);
  m.impl("dropout_mask", &memeff_torch::dropout_mask_cpu);
}
