// Shared pieces of memeff's torch bindings: views of at::Tensors as memeff::TensorViews, the
// translation of memeff::Error into torch's Python-visible errors, and the device-independent
// forward/backward drivers that ops.cpp (CPU) and ops_cuda.cpp (CUDA) call with their stream.
#pragma once

#include <ATen/core/Tensor.h>

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

// "none", "top_left" or "bottom_right".
memeff::CausalMode parse_causal(const std::string& causal);

// The RNG state a call reads: from a CPU int64[2] tensor (values) or a CUDA one (device pointers,
// read by the kernels at run time, which is what keeps CUDA-graph replays fresh). No state is
// needed (and none is read) when dropout_p is 0.
memeff::RngState rng_of(const std::optional<at::Tensor>& rng_state, double dropout_p,
                        const at::Tensor& q);

// Forward on `stream` (null on the CPU): returns (out [B, Hq, Lq, Dv], lse [B, Hq, Lq] fp32).
std::tuple<at::Tensor, at::Tensor> forward_on(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v,
                                              const std::optional<at::Tensor>& bias,
                                              const std::optional<at::Tensor>& rng_state,
                                              double dropout_p, const std::string& causal,
                                              std::optional<double> scale,
                                              const std::vector<std::string>& backends,
                                              void* stream);

// Backward on `stream`: returns (dq, dk, dv, dbias); dbias is an empty [0] tensor unless
// `bias_grad` (then it has the bias's own shape, reduced over its broadcast dimensions).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_on(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& rng_state, double dropout_p, const std::string& causal,
    std::optional<double> scale, bool bias_grad, const std::vector<std::string>& backends,
    void* stream);

}  // namespace memeff_torch
