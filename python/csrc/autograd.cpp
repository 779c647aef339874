// The kernels of memeff::fwd above the device ones, in C++ so that a training step's attention
// runs without Python between the user's call and the kernels. Autograd: the forward op (below
// autograd) draws the dropout state itself, and the saved inputs, out, lse and that state feed
// memeff::bwd, which regenerates the forward's mask. Autocast: q, k and v in the autocast dtype,
// as torch's own SDPA is treated. torch.compile traces both (the ops themselves through their
// fake kernels) like one of torch's fused attention ops. The packed op (varlen_fwd) has the same
// three kernels.
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace memeff_torch {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using FwdSchema = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, double, c10::string_view, std::optional<double>,
    std::vector<std::string>, std::optional<at::Generator>, std::int64_t, std::int64_t, bool,
    std::int64_t, std::int64_t, const std::optional<at::Tensor>&, double);
using BwdSchema = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&,
    const std::optional<at::Tensor>&, double, c10::string_view, std::optional<double>, bool,
    std::vector<std::string>, std::int64_t, std::int64_t, bool, std::int64_t, std::int64_t,
    const std::optional<at::Tensor>&, double);

const c10::TypedOperatorHandle<FwdSchema>& fwd_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("memeff::fwd", "").typed<FwdSchema>();
  return op;
}

const c10::TypedOperatorHandle<BwdSchema>& bwd_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("memeff::bwd", "").typed<BwdSchema>();
  return op;
}

std::optional<at::Tensor> defined_or_none(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// What an autograd Function's backward returns: one entry per input of the op, the gradients of
// the first ones (q, k, v and for the dense op the bias) and undefined (no gradient) after them,
// non-tensor inputs included.
variable_list input_gradients(std::size_t inputs, std::initializer_list<at::Tensor> leading) {
  variable_list grads(inputs);
  std::copy(leading.begin(), leading.end(), grads.begin());
  return grads;
}

// The state the backward regenerates the mask from: the caller's when given, else the one the
// forward drew; none without dropout.
at::Tensor state_to_save(const std::optional<at::Tensor>& rng_state, const at::Tensor& drawn,
                         double dropout_p) {
  if (!(dropout_p > 0.0)) return at::Tensor();
  return rng_state.has_value() && rng_state->defined() ? *rng_state : drawn;
}

// The forward's outputs: lse and the drawn state are not differentiable, and their gradients
// never exist, so backward gets no zero tensors for them.
void mark_outputs(AutogradContext* ctx, const at::Tensor& lse, const at::Tensor& drawn) {
  ctx->mark_non_differentiable({lse, drawn});
  ctx->set_materialize_grads(false);
}

// The non-tensor arguments both ops' backwards take from their forward, kept in saved_data
// (scale, backends, the window and the softcap only when set). The ALiBi slopes are a tensor:
// each op saves them with its tensors.
struct SavedSettings {
  double dropout_p = 0.0;
  std::string causal;
  std::optional<double> scale;
  std::vector<std::string> backends;
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  double softcap = 0.0;

  static void save(AutogradContext* ctx, double dropout_p, c10::string_view causal,
                   std::optional<double> scale, std::vector<std::string> backends,
                   std::int64_t window_left, std::int64_t window_right, double softcap) {
    ctx->saved_data["dropout_p"] = dropout_p;
    ctx->saved_data["causal"] = std::string(causal);
    if (scale) ctx->saved_data["scale"] = *scale;
    if (!backends.empty()) ctx->saved_data["backends"] = std::move(backends);
    if (window_left != -1) ctx->saved_data["window_left"] = window_left;
    if (window_right != -1) ctx->saved_data["window_right"] = window_right;
    if (softcap != 0.0) ctx->saved_data["softcap"] = softcap;
  }

  static SavedSettings load(const AutogradContext* ctx) {
    const auto& data = ctx->saved_data;
    SavedSettings settings;
    settings.dropout_p = data.at("dropout_p").toDouble();
    settings.causal = data.at("causal").toStringRef();
    if (const auto it = data.find("scale"); it != data.end()) {
      settings.scale = it->second.toDouble();
    }
    if (const auto it = data.find("backends"); it != data.end()) {
      settings.backends = it->second.to<std::vector<std::string>>();
    }
    if (const auto it = data.find("window_left"); it != data.end()) {
      settings.window_left = it->second.toInt();
    }
    if (const auto it = data.find("window_right"); it != data.end()) {
      settings.window_right = it->second.toInt();
    }
    if (const auto it = data.find("softcap"); it != data.end()) {
      settings.softcap = it->second.toDouble();
    }
    return settings;
  }
};

// Forward inputs, in order: q, k, v, bias, rng_state, dropout_p, causal, scale, backends,
// generator, q_start, k_start, kv_block, window_left, window_right, alibi_slopes, softcap;
// outputs: out, lse, the drawn rng_state (lse and the state are not differentiable). With global
// coordinates the backward uses the same ones: the gradient of this call's own out (a kv_block
// call's out is its block's partial result, so its gradient is that of the partial result too).
// The backward takes the forward's window, slopes and softcap; the slopes get no gradient.
class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static constexpr std::size_t kInputs = 17;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const std::optional<at::Tensor>& bias,
                               const std::optional<at::Tensor>& rng_state, double dropout_p,
                               c10::string_view causal, std::optional<double> scale,
                               std::vector<std::string> backends,
                               std::optional<at::Generator> generator, std::int64_t q_start,
                               std::int64_t k_start, bool kv_block, std::int64_t window_left,
                               std::int64_t window_right,
                               const std::optional<at::Tensor>& alibi_slopes, double softcap) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, lse, drawn] = fwd_op().call(q, k, v, bias, rng_state, dropout_p, causal, scale,
                                           backends, std::move(generator), q_start, k_start,
                                           kv_block, window_left, window_right, alibi_slopes,
                                           softcap);
    ctx->save_for_backward({q, k, v, bias.value_or(at::Tensor()), out, lse,
                            state_to_save(rng_state, drawn, dropout_p),
                            alibi_slopes.value_or(at::Tensor())});
    mark_outputs(ctx, lse, drawn);
    SavedSettings::save(ctx, dropout_p, causal, scale, std::move(backends), window_left,
                        window_right, softcap);
    if (q_start != 0) ctx->saved_data["q_start"] = q_start;
    if (k_start != 0) ctx->saved_data["k_start"] = k_start;
    if (kv_block) ctx->saved_data["kv_block"] = true;
    return {std::move(out), std::move(lse), std::move(drawn)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& dout = grad_outputs[0];
    if (!dout.defined()) return input_gradients(kInputs, {});  // out did not reach the loss
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& bias = saved[3];
    // needs_input_grad counts tensor inputs only: q, k, v, then the bias (when given) is 3.
    const bool bias_grad = bias.defined() && ctx->needs_input_grad(3);
    const SavedSettings settings = SavedSettings::load(ctx);
    const auto& data = ctx->saved_data;
    auto int_or_zero = [&](const char* key) {
      const auto it = data.find(key);
      return it == data.end() ? std::int64_t{0} : it->second.toInt();
    };
    // Past the Autograd key unless a graph of the backward is wanted (create_graph): its boxed
    // not-implemented fallback costs more than the rest of this function.
    std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
    if (!at::GradMode::is_enabled()) below_autograd.emplace();
    auto [dq, dk, dv, dbias] =
        bwd_op().call(dout, saved[0], saved[1], saved[2], defined_or_none(bias), saved[4], saved[5],
                      defined_or_none(saved[6]), settings.dropout_p, settings.causal,
                      settings.scale, bias_grad, settings.backends, int_or_zero("q_start"),
                      int_or_zero("k_start"), data.count("kv_block") != 0, settings.window_left,
                      settings.window_right, defined_or_none(saved[7]), settings.softcap);
    return input_gradients(kInputs, {std::move(dq), std::move(dk), std::move(dv),
                                     bias_grad ? std::move(dbias) : at::Tensor()});
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd_autograd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& rng_state,
    double dropout_p, c10::string_view causal, std::optional<double> scale,
    std::vector<std::string> backends, std::optional<at::Generator> generator, std::int64_t q_start,
    std::int64_t k_start, bool kv_block, std::int64_t window_left, std::int64_t window_right,
    const std::optional<at::Tensor>& alibi_slopes, double softcap) {
  // Nothing to differentiate (inference, no_grad, or inputs without grad): no graph node, as
  // torch's generated autograd kernels skip theirs.
  const bool bias_grad = bias.has_value() && bias->defined() && bias->requires_grad();
  if (!at::GradMode::is_enabled() ||
      !(q.requires_grad() || k.requires_grad() || v.requires_grad() || bias_grad)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return fwd_op().call(q, k, v, bias, rng_state, dropout_p, causal, scale, std::move(backends),
                         std::move(generator), q_start, k_start, kv_block, window_left,
                         window_right, alibi_slopes, softcap);
  }
  variable_list outputs = AttentionFunction::apply(
      q, k, v, bias, rng_state, dropout_p, causal, scale, std::move(backends),
      std::move(generator), q_start, k_start, kv_block, window_left, window_right, alibi_slopes,
      softcap);
  return {std::move(outputs[0]), std::move(outputs[1]), std::move(outputs[2])};
}

// Under autocast (a mixed-precision region), attention runs in the region's lower precision
// like torch's scaled_dot_product_attention: q, k and v are cast to it (a model's q and k are
// often fp32 after rotary embeddings while v is not). The bias keeps its dtype when it is the
// autocast dtype or fp32, both of which memeff takes.
template <c10::DeviceType kDevice>
std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd_autocast(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& rng_state,
    double dropout_p, c10::string_view causal, std::optional<double> scale,
    std::vector<std::string> backends, std::optional<at::Generator> generator, std::int64_t q_start,
    std::int64_t k_start, bool kv_block, std::int64_t window_left, std::int64_t window_right,
    const std::optional<at::Tensor>& alibi_slopes, double softcap) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(kDevice);
  std::optional<at::Tensor> cast_bias = bias;
  if (bias && bias->defined() && bias->scalar_type() != at::kFloat) {
    cast_bias = at::autocast::cached_cast(dtype, *bias, kDevice);
  }
  return fwd_op().call(
      at::autocast::cached_cast(dtype, q, kDevice), at::autocast::cached_cast(dtype, k, kDevice),
      at::autocast::cached_cast(dtype, v, kDevice), cast_bias, rng_state, dropout_p, causal, scale,
      std::move(backends), std::move(generator), q_start, k_start, kv_block, window_left,
      window_right, alibi_slopes, softcap);  // the slopes stay fp32
}

// Packed variable-length sequences (memeff::varlen_fwd / varlen_bwd): the same scheme as
// AttentionFunction. The maximum lengths stay SymInts here, so torch.compile traces through this
// kernel without fixing them; the device kernels receive them as plain integers.
using VarlenFwdSchema = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    c10::SymInt, c10::SymInt, const std::optional<at::Tensor>&, double, c10::string_view,
    std::optional<double>, std::vector<std::string>, bool, std::optional<at::Generator>,
    std::int64_t, std::int64_t, const std::optional<at::Tensor>&, double);
using VarlenBwdSchema = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, c10::SymInt, c10::SymInt, const at::Tensor&, const at::Tensor&,
    const std::optional<at::Tensor>&, double, c10::string_view, std::optional<double>,
    std::vector<std::string>, std::int64_t, std::int64_t, const std::optional<at::Tensor>&, double);

const c10::TypedOperatorHandle<VarlenFwdSchema>& varlen_fwd_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("memeff::varlen_fwd", "")
                             .typed<VarlenFwdSchema>();
  return op;
}

const c10::TypedOperatorHandle<VarlenBwdSchema>& varlen_bwd_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("memeff::varlen_bwd", "")
                             .typed<VarlenBwdSchema>();
  return op;
}

// Forward inputs, in order: q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
// rng_state, dropout_p, causal, scale, backends, check_offsets, generator, window_left,
// window_right, alibi_slopes, softcap; outputs: out, lse, the drawn rng_state (lse and the state
// are not differentiable).
class VarlenAttentionFunction : public torch::autograd::Function<VarlenAttentionFunction> {
 public:
  static constexpr std::size_t kInputs = 18;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& cu_seqlens_q,
                               const at::Tensor& cu_seqlens_k, c10::SymInt max_seqlen_q,
                               c10::SymInt max_seqlen_k, const std::optional<at::Tensor>& rng_state,
                               double dropout_p, c10::string_view causal,
                               std::optional<double> scale, std::vector<std::string> backends,
                               bool check_offsets, std::optional<at::Generator> generator,
                               std::int64_t window_left, std::int64_t window_right,
                               const std::optional<at::Tensor>& alibi_slopes, double softcap) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, lse, drawn] = varlen_fwd_op().call(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, rng_state, dropout_p,
        causal, scale, backends, check_offsets, std::move(generator), window_left, window_right,
        alibi_slopes, softcap);
    ctx->save_for_backward({q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse,
                            state_to_save(rng_state, drawn, dropout_p),
                            alibi_slopes.value_or(at::Tensor())});
    mark_outputs(ctx, lse, drawn);
    SavedSettings::save(ctx, dropout_p, causal, scale, std::move(backends), window_left,
                        window_right, softcap);
    ctx->saved_data["max_seqlen_q"] = std::move(max_seqlen_q);
    ctx->saved_data["max_seqlen_k"] = std::move(max_seqlen_k);
    return {std::move(out), std::move(lse), std::move(drawn)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& dout = grad_outputs[0];
    if (!dout.defined()) return input_gradients(kInputs, {});  // out did not reach the loss
    const variable_list saved = ctx->get_saved_variables();
    const SavedSettings settings = SavedSettings::load(ctx);
    const auto& data = ctx->saved_data;
    std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;  // as in AttentionFunction
    if (!at::GradMode::is_enabled()) below_autograd.emplace();
    auto [dq, dk, dv] = varlen_bwd_op().call(
        dout, saved[0], saved[1], saved[2], saved[3], saved[4], data.at("max_seqlen_q").toSymInt(),
        data.at("max_seqlen_k").toSymInt(), saved[5], saved[6], defined_or_none(saved[7]),
        settings.dropout_p, settings.causal, settings.scale, settings.backends,
        settings.window_left, settings.window_right, defined_or_none(saved[8]), settings.softcap);
    return input_gradients(kInputs, {std::move(dq), std::move(dk), std::move(dv)});
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_fwd_autograd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, c10::SymInt max_seqlen_q, c10::SymInt max_seqlen_k,
    const std::optional<at::Tensor>& rng_state, double dropout_p, c10::string_view causal,
    std::optional<double> scale, std::vector<std::string> backends, bool check_offsets,
    std::optional<at::Generator> generator, std::int64_t window_left, std::int64_t window_right,
    const std::optional<at::Tensor>& alibi_slopes, double softcap) {
  if (!at::GradMode::is_enabled() ||
      !(q.requires_grad() || k.requires_grad() || v.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return varlen_fwd_op().call(q, k, v, cu_seqlens_q, cu_seqlens_k, std::move(max_seqlen_q),
                                std::move(max_seqlen_k), rng_state, dropout_p, causal, scale,
                                std::move(backends), check_offsets, std::move(generator),
                                window_left, window_right, alibi_slopes, softcap);
  }
  variable_list outputs = VarlenAttentionFunction::apply(
      q, k, v, cu_seqlens_q, cu_seqlens_k, std::move(max_seqlen_q), std::move(max_seqlen_k),
      rng_state, dropout_p, causal, scale, std::move(backends), check_offsets,
      std::move(generator), window_left, window_right, alibi_slopes, softcap);
  return {std::move(outputs[0]), std::move(outputs[1]), std::move(outputs[2])};
}

// Autocast for the packed op: q, k and v in the region's dtype (the offsets are int32).
template <c10::DeviceType kDevice>
std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_fwd_autocast(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, c10::SymInt max_seqlen_q, c10::SymInt max_seqlen_k,
    const std::optional<at::Tensor>& rng_state, double dropout_p, c10::string_view causal,
    std::optional<double> scale, std::vector<std::string> backends, bool check_offsets,
    std::optional<at::Generator> generator, std::int64_t window_left, std::int64_t window_right,
    const std::optional<at::Tensor>& alibi_slopes, double softcap) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(kDevice);
  return varlen_fwd_op().call(
      at::autocast::cached_cast(dtype, q, kDevice), at::autocast::cached_cast(dtype, k, kDevice),
      at::autocast::cached_cast(dtype, v, kDevice), cu_seqlens_q, cu_seqlens_k,
      std::move(max_seqlen_q), std::move(max_seqlen_k), rng_state, dropout_p, causal, scale,
      std::move(backends), check_offsets, std::move(generator), window_left, window_right,
      alibi_slopes, softcap);
}

}  // namespace
}  // namespace memeff_torch

TORCH_LIBRARY_IMPL(memeff, Autograd, m) {
  m.impl("fwd", &memeff_torch::fwd_autograd);
  m.impl("varlen_fwd", &memeff_torch::varlen_fwd_autograd);
}
TORCH_LIBRARY_IMPL(memeff, AutocastCPU, m) {
  m.impl("fwd", &memeff_torch::fwd_autocast<c10::DeviceType::CPU>);
  m.impl("varlen_fwd", &memeff_torch::varlen_fwd_autocast<c10::DeviceType::CPU>);
}
TORCH_LIBRARY_IMPL(memeff, AutocastCUDA, m) {
  m.impl("fwd", &memeff_torch::fwd_autocast<c10::DeviceType::CUDA>);
  m.impl("varlen_fwd", &memeff_torch::varlen_fwd_autocast<c10::DeviceType::CUDA>);
}
