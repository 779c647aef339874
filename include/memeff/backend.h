// The backend interface and the validated problem description every backend receives.
// Backends (reference, cpu, cuda, cuda_math, or a test's fake) are registered by name; the
// dispatcher asks each one why it cannot run a problem and runs the first with no reasons.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "memeff/attention.h"
#include "memeff/dropout.h"
#include "memeff/tensor.h"

namespace memeff {

// The sizes and flags of a validated call; what backends decide on. Built by the validators.
struct Problem {
  std::int64_t B = 0, Hq = 0, Hkv = 0, Lq = 0, Lk = 0, D = 0, Dv = 0;
  DType dtype = DType::f32;  // of q, k, v, out and the gradients
  Device device{};
  bool has_bias = false;
  DType bias_dtype = DType::f32;
  // True where the bias broadcasts (has size 1) along B, H or Lq.
  bool bias_bcast_b = false, bias_bcast_h = false, bias_bcast_q = false;
  double scale = 1.0;
  CausalMode causal = CausalMode::none;
  double dropout_p = 0.0;
  DropoutThreshold dropout{};  // quantized p
  // Every q/k/v/out/gradient view starts on a 16-byte boundary and its B, H and L strides are
  // whole 16-byte steps: what kernels loading 16-byte vectors need. Set by the validators.
  bool vector_aligned = true;
  // Packed sequences (AttentionArgs::packed): B is the number of sequences S, Lq and Lk the
  // maximum lengths, total_q and total_k the rows of the packed tensors. Per-sequence lengths
  // live in the offsets only, so causal_shift() is per sequence there (Lk_s - Lq_s).
  bool packed = false;
  std::int64_t total_q = 0, total_k = 0;
  // The batch index the dropout map gives b = 0: a backend that runs packed sequences one at a
  // time as B = 1 problems sets it to the sequence, so the mask stays (b = s, h, i, j).
  std::int64_t rng_batch0 = 0;
  // Global coordinates (AttentionArgs::q_start, k_start, kv_block): row i and key j of the call
  // are row q_start + i and key k_start + j of the dropout map and of top_left causal masking;
  // kv_block: the backward's out and lse are a larger attention's (no single-key shortcut).
  std::int64_t q_start = 0, k_start = 0;
  bool kv_block = false;
  // Score modifiers (AttentionArgs::window, alibi_slopes, softcap; docs/window.md). The window's
  // sides are -1 (unbounded) or >= 0, capped at kWindowCap (wider is the same window); right is
  // the user's, before causal caps it at 0 (visible_key_span applies that).
  std::int64_t window_left = -1, window_right = -1;
  bool has_alibi = false;
  bool alibi_per_batch = false;  // slopes [B, Hq] rather than [Hq]
  double softcap = 0.0;          // 0: off
  // Any window side beyond every distance a call can have (2^36 keys, 2^32 rows) is this.
  static constexpr std::int64_t kWindowCap = std::int64_t{1} << 40;

  bool has_dropout() const { return dropout.threshold < 256; }
  bool has_global_coordinates() const { return q_start != 0 || k_start != 0 || kv_block; }
  std::int64_t group_size() const { return Hkv > 0 ? Hq / Hkv : 0; }
  // Query i sees key j iff j <= i + causal_shift() (when causal is not none): top_left compares
  // global coordinates (k_start + j <= q_start + i); bottom_right (never with starts) aligns the
  // last query with the last key.
  std::int64_t causal_shift() const {
    return causal == CausalMode::bottom_right ? Lk - Lq : q_start - k_start;
  }
  bool has_window() const { return window_left >= 0 || window_right >= 0; }
  bool has_softcap() const { return softcap > 0.0; }
  // Any of window, ALiBi and softcap: what backends without them refuse (score_modifier_reasons).
  bool has_score_modifiers() const { return has_window() || has_alibi || has_softcap(); }
  // Where query i's diagonal meets the keys, for the window and ALiBi: key i + position_shift().
  // causal_shift() where causal; without causal the bottom-right alignment Lk - Lq (global
  // coordinates are refused there by validation).
  std::int64_t position_shift() const {
    return causal == CausalMode::top_left ? q_start - k_start : Lk - Lq;
  }
  // "bhqk" with a 1 for each broadcast dimension, "none" without bias.
  std::string bias_pattern() const;
  std::string describe() const;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual DeviceType device_type() const = 0;

  // Every reason this backend cannot run the problem; empty when it can.
  virtual std::vector<std::string> reasons_unsupported(const Problem& problem, Pass pass) const = 0;

  // Whether the backend honours Problem::q_start, k_start and kv_block (global coordinates for
  // the dropout map and the causal mask; the backward of one key block). The dispatcher refuses
  // calls that use them for a backend that does not say so, with a reason, so a backend written
  // before them never misreads such a call as a standalone attention.
  virtual bool supports_global_coordinates() const { return false; }

  // Scratch bytes wanted for the pass (0 by default).
  virtual std::size_t workspace_bytes(const Problem&, Pass) const { return 0; }

  // Autotuning: the milliseconds one call of `run` (a pass of this backend with `options`)
  // takes. The default reads the host's steady clock, which is right for backends that finish
  // their work before returning (reference, cpu); it refuses (ErrorCode::unsupported, so the
  // candidate is reported as failed, not mistimed) for a backend whose device_type() is cuda, which
  // must override it to time on the device, e.g. with CUDA events recorded on options.stream
  // around `run` on problem.device.
  virtual double time_ms(const Problem& problem, const Options& options,
                         const std::function<void()>& run);
  // The device as autotune keys name it, so that a winner is never reused on other hardware.
  // The default: "cpu <model name>" for the host, "cuda:N" for a GPU (a CUDA backend should
  // override it with the GPU's name and compute capability, "NVIDIA H200 sm_90").
  virtual std::string device_label(Device device) const;

  virtual void forward(const Problem& problem, const AttentionArgs& args, const TensorView& out,
                       const TensorView& lse, const Options& options) = 0;
  virtual void backward(const Problem& problem, const AttentionArgs& args,
                        const BackwardTensors& grads, const Options& options) = 0;
};

// Adds (or replaces, by name) a backend in the registry. Built-in backends register themselves.
void register_backend(std::shared_ptr<Backend> backend);
// Removes a backend by name; returns whether it was there (for tests of fake backends).
bool unregister_backend(const std::string& name);
std::shared_ptr<Backend> find_backend(const std::string& name);
std::vector<std::string> backend_names();

// The instruction set of the cpu backend's kernels on this machine: "avx512", "avx2" or
// "scalar" (the best the CPU has, capped by MEMEFF_CPU_ISA).
const char* cpu_kernel_isa();

// The reasons of a backend that has none of window, ALiBi and softcap yet, one per feature the
// problem uses ("window: not in the <backend> kernels yet"); empty when it uses none.
std::vector<std::string> score_modifier_reasons(const Problem& problem, const std::string& backend);

// Validation: throw memeff::Error (invalid_argument) naming the first bad argument.
Problem validate_inputs(const AttentionArgs& args);
Problem validate_forward(const AttentionArgs& args, const TensorView& out, const TensorView& lse);
Problem validate_backward(const AttentionArgs& args, const BackwardTensors& grads);
// The values of a packed call's offsets (host copies of cu_seqlens_q and cu_seqlens_k, S + 1
// entries each): 0 first, non-decreasing, the packed row counts last, no sequence longer than
// max_seqlen. The validators run it for host tensors; CUDA backends after copying the offsets.
void validate_packed_offsets(const std::int32_t* cu_seqlens_q, const std::int32_t* cu_seqlens_k,
                             const Problem& problem);

}  // namespace memeff
