// The kernels of the device ops fwd, bwd, varlen_fwd, varlen_bwd and draw_rng_state for one
// device type, written once over the drivers of bindings.h: ops.cpp registers them for the CPU,
// ops_cuda.cpp for CUDA. The signatures are the ops' schemas (ops.cpp, TORCH_LIBRARY).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"

namespace memeff_torch {

// Device is what differs between the CPU and CUDA:
//   Guard                   constructed from q's device, holds the call on that device
//   stream(q)               the stream the call runs on (null on the CPU)
//   draw_state(q, gen)      a fresh (seed, offset) from the device's generator (ops.cpp, fwd)
//   check_packed_devices(q, k, v, cu_seqlens_q, cu_seqlens_k, rng_state)
//                           names the argument on another device when a packed call's tensors
//                           are not all on q's device type
template <class Device>
struct DeviceKernels {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd(
      const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
      const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& rng_state,
      double dropout_p, c10::string_view causal, std::optional<double> scale,
      std::vector<std::string> backends, std::optional<at::Generator> generator,
      std::int64_t q_start, std::int64_t k_start, bool kv_block, std::int64_t window_left,
      std::int64_t window_right, const std::optional<at::Tensor>& alibi_slopes, double softcap) {
    const typename Device::Guard guard(q.device());
    return forward_on(q, k, v, bias, rng_state, draw_if_needed(q, rng_state, dropout_p, generator),
                      dropout_p, causal, scale, std::move(backends), {q_start, k_start, kv_block},
                      {window_left, window_right, alibi_slopes, softcap}, Device::stream(q));
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bwd(
      const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
      const std::optional<at::Tensor>& bias, const at::Tensor& out, const at::Tensor& lse,
      const std::optional<at::Tensor>& rng_state, double dropout_p, c10::string_view causal,
      std::optional<double> scale, bool bias_grad, std::vector<std::string> backends,
      std::int64_t q_start, std::int64_t k_start, bool kv_block, std::int64_t window_left,
      std::int64_t window_right, const std::optional<at::Tensor>& alibi_slopes, double softcap) {
    const typename Device::Guard guard(q.device());
    return backward_on(dout, q, k, v, bias, out, lse, rng_state, dropout_p, causal, scale,
                       bias_grad, std::move(backends), {q_start, k_start, kv_block},
                       {window_left, window_right, alibi_slopes, softcap}, Device::stream(q));
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_fwd(
      const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens_q,
      const at::Tensor& cu_seqlens_k, std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
      const std::optional<at::Tensor>& rng_state, double dropout_p, c10::string_view causal,
      std::optional<double> scale, std::vector<std::string> backends, bool check_offsets,
      std::optional<at::Generator> generator, std::int64_t window_left, std::int64_t window_right,
      const std::optional<at::Tensor>& alibi_slopes, double softcap) {
    Device::check_packed_devices(q, k, v, cu_seqlens_q, cu_seqlens_k, rng_state);
    const typename Device::Guard guard(q.device());
    return varlen_forward_on(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             rng_state, draw_if_needed(q, rng_state, dropout_p, generator),
                             dropout_p, causal, scale, std::move(backends), check_offsets,
                             {window_left, window_right, alibi_slopes, softcap},
                             Device::stream(q));
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_bwd(
      const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
      const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, std::int64_t max_seqlen_q,
      std::int64_t max_seqlen_k, const at::Tensor& out, const at::Tensor& lse,
      const std::optional<at::Tensor>& rng_state, double dropout_p, c10::string_view causal,
      std::optional<double> scale, std::vector<std::string> backends, std::int64_t window_left,
      std::int64_t window_right, const std::optional<at::Tensor>& alibi_slopes, double softcap) {
    const typename Device::Guard guard(q.device());
    return varlen_backward_on(dout, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              out, lse, rng_state, dropout_p, causal, scale, std::move(backends),
                              {window_left, window_right, alibi_slopes, softcap},
                              Device::stream(q));
  }

  // A fresh (seed, offset) as fwd draws it, for callers that need the state before the call
  // (the context-parallel ring shares one over its ranks); `like` selects the device.
  static at::Tensor draw_rng_state(const at::Tensor& like, std::optional<at::Generator> generator) {
    const typename Device::Guard guard(like.device());
    return Device::draw_state(like, generator);
  }

 private:
  // The forward's `drawn` argument: a fresh state when needs_draw(), else no_state().
  static at::Tensor draw_if_needed(const at::Tensor& q, const std::optional<at::Tensor>& rng_state,
                                   double dropout_p,
                                   const std::optional<at::Generator>& generator) {
    return needs_draw(rng_state, dropout_p) ? Device::draw_state(q, generator) : no_state();
  }
};

}  // namespace memeff_torch
