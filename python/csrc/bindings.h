// Shared pieces of memeff's torch bindings: views of at::Tensors as memeff::TensorViews, outputs
// allocated in their inputs' layout, the translation of memeff::Error into torch's Python-visible
// errors, and the device-independent forward/backward drivers (defined in ops.cpp) that the CPU
// and CUDA kernels (device_kernels.h) call with their stream and the call's RNG state.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings_errors.h"  // translate_errors: memeff::Error -> torch errors
#include "memeff/attention.h"

namespace memeff_torch {

// A view of a tensor of rank <= 4 (the caller makes the last dimension contiguous).
memeff::TensorView view_of(const at::Tensor& t, const char* name);

// The tensor itself when its last dimension is contiguous, else a contiguous copy.
at::Tensor last_dim_contiguous(const at::Tensor& t);

// A new [B, H, L, last] tensor (sizes from `like`'s first three dimensions) whose dimensions
// are laid out in memory in the order of `like`'s: a [B, L, H, D]-strided `like` gives a
// [B, L, H, last]-strided result, so the attention output of a model that views [B, L, H·D]
// projections as [B, H, L, D] reshapes back without a copy (and so do dq, dk and dv).
// Dimensions of size 1 or stride 0 count as outermost; ties keep the logical order. A packed
// [total, H, D] `like` gives [total, H, last] by the same rule over its first two dimensions.
// python/memeff/torch/__init__.py (_empty_in_layout_of) mirrors this rule for the fake kernels.
at::Tensor empty_in_layout_of(const at::Tensor& like, std::int64_t last);

// A causal mode by memeff's name of it (memeff::causal_mode_from_name: "none", "top_left",
// "bottom_right"); any other text is a ValueError that names `causal` and lists the names.
memeff::CausalMode parse_causal(c10::string_view causal);

// The RNG state a call reads, from an int64[2] (seed, offset) tensor: on the CPU its values
// (for CPU and CUDA calls alike), on the device of q its address (read by the kernels when they
// run: how a CUDA graph's replays see fresh values). Nothing is read when dropout_p is 0.
memeff::RngState rng_of(const at::Tensor& rng_state, double dropout_p, const at::Tensor& q);

// Whether a forward draws a fresh (seed, offset): dropout on and no state given.
bool needs_draw(const std::optional<at::Tensor>& rng_state, double dropout_p);

// The `rng_state` output of a forward that drew nothing (an empty int64 CPU tensor).
at::Tensor no_state();

// A CPU int64[2] tensor holding (seed, offset): a drawn state outside CUDA-graph capture.
at::Tensor cpu_state(std::uint64_t seed, std::uint64_t offset);

// Where a dense call sits in a larger attention (memeff::AttentionArgs::q_start, k_start,
// kv_block; docs/context_parallel.md): the ops' optional `q_start`, `k_start` and `kv_block`
// arguments. The defaults are an ordinary call.
struct BlockCoordinates {
  std::int64_t q_start = 0;
  std::int64_t k_start = 0;
  bool kv_block = false;
};

// The score modifiers of docs/window.md (memeff::AttentionArgs::window, alibi_slopes, softcap):
// the ops' keyword-only window_left, window_right, alibi_slopes and softcap. The defaults change
// nothing; memeff validates them and names the argument.
struct ScoreModifiers {
  std::int64_t window_left = -1;   // -1: unbounded
  std::int64_t window_right = -1;  // -1: unbounded
  std::optional<at::Tensor> alibi_slopes;  // fp32 [Hq] or [B, Hq] ([S, Hq] packed)
  double softcap = 0.0;                    // 0: off
};

// The forward op on `stream` (null on the CPU): reads the caller's `rng_state` when given, else
// `drawn` (a state the device's kernel drew when needs_draw(), else no_state()), and returns
// (out [B, Hq, Lq, Dv] in q's layout, lse [B, Hq, Lq] fp32, drawn).
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_on(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& rng_state,
    at::Tensor drawn, double dropout_p, c10::string_view causal, std::optional<double> scale,
    std::vector<std::string> backends, const BlockCoordinates& coords,
    const ScoreModifiers& modifiers, void* stream);

// Backward on `stream`: returns (dq, dk, dv, dbias), dq/dk/dv in the layouts of q/k/v; dbias
// is an empty [0] tensor unless `bias_grad` (then it has the bias's own shape, reduced over its
// broadcast dimensions). With `coords.kv_block`, out and lse are the whole attention's rows and the
// gradients this key block's share.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_on(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& rng_state, double dropout_p, c10::string_view causal,
    std::optional<double> scale, bool bias_grad, std::vector<std::string> backends,
    const BlockCoordinates& coords, const ScoreModifiers& modifiers, void* stream);

// The packed (variable-length) forward on `stream`: q [total_q, Hq, D], k [total_k, Hkv, D],
// v [total_k, Hkv, Dv], int32 offsets [S + 1] on the device of q; returns (out [total_q, Hq, Dv]
// in q's layout, lse [Hq, total_q] fp32, drawn). The state is read as by forward_on.
std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_forward_on(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
    const std::optional<at::Tensor>& rng_state, at::Tensor drawn, double dropout_p,
    c10::string_view causal, std::optional<double> scale, std::vector<std::string> backends,
    bool check_offsets, const ScoreModifiers& modifiers, void* stream);

// Its backward on `stream`: (dq, dk, dv) in the layouts of q, k, v; the offsets are not read on
// the host (the forward checked them when asked to).
std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_backward_on(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, std::int64_t max_seqlen_q,
    std::int64_t max_seqlen_k, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& rng_state, double dropout_p, c10::string_view causal,
    std::optional<double> scale, std::vector<std::string> backends,
    const ScoreModifiers& modifiers, void* stream);

}  // namespace memeff_torch
