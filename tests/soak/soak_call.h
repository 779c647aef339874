// One call of the soak run (memeff_soak.cpp): every parameter drawn at random from (seed, call
// index), so any call can be replayed alone; the pools of N(0, 1) values the inputs are views of
// (no per-call input generation); and the call's tensors on its device, outputs poisoned.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cli_device.h"
#include "memeff/attention.h"
#include "memeff/tensor.h"

namespace memeff::soak {

// A view of `dims` over `data`: contiguous, or (blhd, rank 4) [B, L, H, X] storage of a logical
// [B, H, L, X].
TensorView view_of(const void* data, DType dtype, Device device,
                   const std::vector<std::int64_t>& dims, bool blhd = false);
std::vector<std::int64_t> shape_of(const TensorView& view);

// What a call may draw.
struct Limits {
  std::int64_t max_len = 1024;          // Lq, Lk and packed sequence lengths: 1..max_len
  std::int64_t max_head_dim = 256;      // D and Dv
  std::int64_t max_elements = 1 << 22;  // per tensor (q, k, v, dout, out, bias, ...)
  std::int64_t max_kv_heads = 4;        // Hkv; Hq = Hkv · group, group 1, 2, 4 or 8
  std::int64_t max_batch = 4;           // B, and the sequences of a packed call
};

// Every drawn parameter of one call.
struct CallSpec {
  std::uint64_t index = 0;
  std::string backend;
  Device device{};
  DType dtype = DType::f32;
  bool backward = false;  // forward only, or forward then backward
  bool packed = false;    // AttentionArgs::packed: B sequences of these lengths
  std::int64_t B = 1, Hq = 1, Hkv = 1, Lq = 1, Lk = 1, D = 8, Dv = 8;  // packed: Lq, Lk the maxima
  std::vector<std::int64_t> seqlens_q, seqlens_k;
  CausalMode causal = CausalMode::none;
  double dropout = 0.0;
  std::uint64_t rng_seed = 0, rng_offset = 0;
  std::string bias = "none";  // or "bhqk" with '1' for each broadcast dimension
  DType bias_dtype = DType::f32;
  bool blhd = false;  // dense tensors in [B, L, H, D] storage, viewed through strides
  std::optional<double> scale;
  bool deterministic = false;     // Options::deterministic
  bool caller_workspace = false;  // Options::workspace of workspace_size() bytes, else none
  std::int64_t pool_start = 0;  // element of the input pool where q starts; k, v, dout, bias follow
  bool misaligned = false;      // pool_start is odd: the views miss 16-byte boundaries

  bool has_bias() const { return bias != "none"; }
  std::int64_t group() const { return Hq / Hkv; }
  std::int64_t total_q() const;  // packed rows of q (dense: B·Lq)
  std::int64_t total_k() const;
  // The bias's shape over [B, Hq, Lq, Lk] (1 where it broadcasts).
  std::vector<std::int64_t> bias_shape() const;
  // Input elements the call takes from the pool, each tensor rounded up to 8 elements.
  std::int64_t pool_elements() const;
  // One line with every parameter: "call 12: cuda bf16 fwd+bwd B=2 Hq=8 Hkv=2 ...".
  std::string describe() const;
};

// The generator of call `index` of a run with `seed`: the same pair gives the same draws.
std::mt19937_64 call_generator(std::uint64_t seed, std::uint64_t index);

// Draws one call for one of `backends` (picked at random) within `limits`; pool_start is drawn
// within `pool_size` elements. Further draws from the same generator give the redraws.
CallSpec draw_call(const std::vector<std::string>& backends, const Limits& limits,
                   std::int64_t pool_size, std::uint64_t index, std::mt19937_64& gen);

// The inputs' values: `elements` N(0, 1) values rounded to each of fp32, fp16 and bf16 on the
// host, and a copy on each CUDA device that asks for one. A call's inputs are views into them,
// so a call generates nothing and allocates only its outputs.
class InputPools {
 public:
  InputPools(std::uint64_t seed, std::int64_t elements);
  // Copies the pool of `dtype` to `device` (before the memory baseline: nothing grows later).
  void prepare(DType dtype, Device device);
  std::int64_t elements() const { return elements_; }
  const void* host(DType dtype) const;
  const void* on(DType dtype, Device device) const;

 private:
  std::int64_t elements_;
  std::map<DType, std::vector<unsigned char>> host_;
  std::map<std::pair<DType, int>, cli::Buffer> device_;  // (dtype, CUDA ordinal)
};

// An output's device memory and its view.
struct Output {
  cli::Buffer buffer;
  TensorView view;
};

// One call's tensors: inputs as views into the pools (also over the host pool, for the
// reference); outputs, once allocate_outputs() made them, on the call's device, poisoned with
// NaN (the gradients only for a backward).
struct CallTensors {
  AttentionArgs args;       // on the call's device
  AttentionArgs host_args;  // the same inputs on the host
  TensorView dout, host_dout;
  cli::Buffer cu_q, cu_k;  // packed offsets on the device
  std::vector<std::int32_t> cu_q_host, cu_k_host;
  Output out, lse, dq, dk, dv, dbias;

  CallTensors(const CallSpec& spec, const InputPools& pools);
  void allocate_outputs(const CallSpec& spec);
  BackwardTensors grads() const;
};

}  // namespace memeff::soak
