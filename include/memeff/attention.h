// The attention entry points: forward (out, lse) and backward (dq, dk, dv, dbias), with causal
// masks, an additive broadcastable bias, grouped-query attention and in-kernel dropout.
//
// Shapes (logical; strides free except the last dimension, which is contiguous):
//   q    [B, Hq,  Lq, D]      k [B, Hkv, Lk, D]      v [B, Hkv, Lk, Dv]     Hq % Hkv == 0
//   bias [B|1, Hq|1, Lq|1, Lk] (optional, additive, broadcast over dims of size 1)
//   out  [B, Hq, Lq, Dv]      lse [B, Hq, Lq] fp32, natural log of the softmax denominator
// A query row that sees no key (Lk = 0, bottom-right causal with Lq > Lk, a window that leaves it
// no key, or a bias of -inf everywhere) gives out = 0, lse = -inf and zero gradients.
// Sliding windows, ALiBi and softcapping (AttentionArgs::window, alibi_slopes, softcap) change
// the score of query i and key j: docs/window.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memeff/tensor.h"

namespace memeff {

enum class CausalMode : std::uint8_t {
  none,
  top_left,      // query i sees keys j <= i
  bottom_right,  // query i sees keys j <= i + (Lk - Lq): the last query sees every key
};

// The one spelling of each mode ("none", "top_left", "bottom_right"): the C++ API, the program's
// flags and reports and the Python ops all use it; causal_mode_from_name is its inverse (nullopt
// for any other text).
const char* causal_mode_name(CausalMode mode);
std::optional<CausalMode> causal_mode_from_name(std::string_view name);

// Dropout randomness: the mask is a pure function of (seed, offset, b, h, i, j); see
// docs/dropout.md. For CUDA graphs, kernels can read seed and offset from device memory at run
// time instead of the values (the pointers are on the device of the inputs).
struct RngState {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  const std::uint64_t* device_seed = nullptr;    // if set, overrides `seed` (CUDA only)
  const std::uint64_t* device_offset = nullptr;  // if set, overrides `offset` (CUDA only)
};

// A sliding window around each query's diagonal (docs/window.md). Query i sees key j iff
//   i + shift - left <= j <= i + shift + right
// where i and j are global positions (q_start + i, k_start + j, as causal masking compares) and
// shift aligns the diagonal: q_start - k_start for causal top_left, Lk - Lq (per sequence when
// packed) for causal bottom_right *and for causal none* (the last query's diagonal is the last
// key, as FlashAttention's window_size counts without causal). A negative side is unbounded: the
// default {-1, -1} is no window. With a causal mode, right is capped at 0. Each side is -1 or
// >= 0; left = right = 0 leaves the diagonal alone. Without causal or with bottom_right, refused
// with q_start/k_start/kv_block (the diagonal depends on the whole attention's lengths).
struct Window {
  std::int64_t left = -1;   // keys before the diagonal a query sees; -1: all of them
  std::int64_t right = -1;  // keys after the diagonal a query sees; -1: all of them
  bool bounded() const { return left >= 0 || right >= 0; }
  friend bool operator==(const Window&, const Window&) = default;
};

// Packed variable-length sequences (docs/api.md, "Packed sequences"). Sequence s owns query rows
// [cu_seqlens_q[s], cu_seqlens_q[s+1]) of q and key rows [cu_seqlens_k[s], cu_seqlens_k[s+1]) of
// k and v, and attends only within itself. With `AttentionArgs::packed` set the tensors have no
// batch dimension (strides free, last dimension contiguous):
//   q [total_q, Hq, D]   k [total_k, Hkv, D]   v [total_k, Hkv, Dv]
//   out [total_q, Hq, Dv]   lse [Hq, total_q] fp32   gradients shaped as their tensors
// Causal modes apply per sequence (bottom_right aligns each sequence's last query with its last
// key) and dropout element (s, h, i, j), i and j positions inside sequence s, is the padded
// batch's element (b = s, h, i, j): packing never changes the mask. A bias is not supported.
struct PackedSequences {
  TensorView cu_seqlens_q;  // int32 [S + 1] on the device of q: 0, non-decreasing, total_q last
  TensorView cu_seqlens_k;  // int32 [S + 1] on the device of q: 0, non-decreasing, total_k last
  std::int64_t max_seqlen_q = 0;  // at least every sequence's query length
  std::int64_t max_seqlen_k = 0;  // at least every sequence's key length
  // Read the offsets and check them (on CUDA a copy to the host and a stream synchronization;
  // skipped while the stream captures a CUDA graph). Unchecked offsets never make a kernel read
  // or write outside the tensors (they are clamped into them), but give meaningless results.
  bool check_offsets = true;
};

struct AttentionArgs {
  TensorView q, k, v;
  std::optional<TensorView> bias;
  std::optional<double> scale;  // default 1/sqrt(D)
  CausalMode causal = CausalMode::none;
  double dropout_p = 0.0;  // in [0, 1)
  RngState rng{};
  std::optional<PackedSequences> packed;  // set: q, k, v, out, lse are packed (see above)

  // Where this call sits in a larger attention (context parallelism, docs/context_parallel.md):
  // query row i is row q_start + i of the whole attention and key j is key k_start + j. The
  // dropout mask is drawn at those global coordinates, so a sharded run draws the single-device
  // mask, and top_left causal masking compares them (query i sees key j iff
  // k_start + j <= q_start + i). bottom_right is refused with nonzero starts or kv_block: its
  // diagonal depends on the whole attention's lengths, which a slice does not know (for a square
  // attention it is top_left). Not with `packed`. Starts >= 0; q_start + Lq <= 2^32 and
  // k_start + Lk <= 2^36 (the dropout map's range).
  std::int64_t q_start = 0;
  std::int64_t k_start = 0;
  // This call's keys are one block of the whole attention's keys. The forward is unchanged (its
  // out and lse are the block's partial result, merged by the caller through lse). The backward
  // takes the *whole* attention's out and lse in BackwardTensors (P = exp(S - lse) and
  // D = rowsum(dout ∘ out) from them) and writes this block's share of dq, dk, dv and dbias,
  // which the caller sums over blocks.
  bool kv_block = false;

  // Score modifiers (docs/window.md). With s = scale·q·k the score of (i, j) is
  //   softcap > 0 ? softcap·tanh(s / softcap) : s,  plus bias, plus -slope·|i + shift - j|
  // (shift as in Window; ALiBi thus follows the window's alignment), then masked by causal and
  // window. The backward takes the derivative of the cap (1 - tanh²); dbias receives the
  // gradient of the score after the cap; the slopes get no gradient.
  Window window{};
  // fp32 slopes on the device of q, [Hq] (one per query head) or [B, Hq] (per batch element and
  // head; packed: [S, Hq], per sequence). Any finite value; never expanded to an Lq×Lk bias.
  std::optional<TensorView> alibi_slopes;
  double softcap = 0.0;  // 0: off; else finite and > 0 (Gemma-2 uses 50 for attention scores)

  bool has_global_coordinates() const { return q_start != 0 || k_start != 0 || kv_block; }
};

enum class Pass : std::uint8_t { forward, backward };

// Per-call options. Empty fields fall back to the thread's scoped settings, then the
// environment (MEMEFF_BACKENDS, MEMEFF_AUTOTUNE), then the defaults.
struct Options {
  // Allow-list of backend names in priority order ("cuda_sm90", "cuda", "cuda_math", "cpu", "reference").
  std::vector<std::string> backends;
  void* stream = nullptr;          // cudaStream_t for CUDA backends; null is the default stream
  void* workspace = nullptr;       // caller-provided scratch (see workspace_size)
  std::size_t workspace_bytes = 0;
  bool deterministic = false;      // bitwise repeatable backward where the backend supports it
  std::optional<bool> autotune;    // time the candidates once per shape and remember the winner
};

// What a call did.
struct CallInfo {
  std::string backend;       // the backend that ran
  double p_effective = 0.0;  // the dropout probability actually applied (1 - t/256)
};

struct BackwardTensors {  // packed calls: dout, dq like out and q; dk, dv like k and v
  TensorView dout;  // [B, Hq, Lq, Dv]
  TensorView out;   // forward's out
  TensorView lse;   // forward's lse
  TensorView dq;    // [B, Hq, Lq, D]
  TensorView dk;    // [B, Hkv, Lk, D]   summed over the query heads of each group
  TensorView dv;    // [B, Hkv, Lk, Dv]
  std::optional<TensorView> dbias;  // the bias's own shape; reduced over broadcast dimensions
};

// Forward pass: writes out and lse.
CallInfo forward(const AttentionArgs& args, const TensorView& out, const TensorView& lse,
                 const Options& options = {});

// Backward pass: writes dq, dk, dv and dbias (when given). Same args (and RNG state) as the
// forward whose out and lse are passed.
CallInfo backward(const AttentionArgs& args, const BackwardTensors& grads,
                  const Options& options = {});

// Scratch bytes the chosen backend wants for a pass. Passing that much in Options::workspace
// keeps the call free of allocations; with none given the backend allocates on the stream.
std::size_t workspace_size(const AttentionArgs& args, Pass pass, const Options& options = {});

// FLOPs of one forward pass by the project's convention: 4·B·Hq·Lq·Lk·D (halved when causal);
// with a bounded window, 4·B·Hq·D·visible_pairs instead (the work a window leaves);
// a pass counts pass_flop_factor(pass) times this (the backward 2.5: five matrix products of
// the forward's size against its two, as PyTorch's and FlashAttention's benchmarks count).
double attention_flops(std::int64_t B, std::int64_t Hq, std::int64_t Lq, std::int64_t Lk,
                       std::int64_t D, CausalMode causal);
double attention_flops(std::int64_t B, std::int64_t Hq, std::int64_t Lq, std::int64_t Lk,
                       std::int64_t D, CausalMode causal, const Window& window);
// The same for packed sequences of the given query and key lengths (the sum over sequences).
double attention_flops_packed(const std::vector<std::int64_t>& seqlens_q,
                              const std::vector<std::int64_t>& seqlens_k, std::int64_t Hq,
                              std::int64_t D, CausalMode causal, const Window& window = {});
// The exact number of (query, key) pairs of one head that the causal mode and the window leave
// visible (the rule of Window, with q_start = k_start = 0). O(Lq).
std::int64_t visible_pairs(std::int64_t Lq, std::int64_t Lk, CausalMode causal,
                           const Window& window);

constexpr double pass_flop_factor(Pass pass) { return pass == Pass::backward ? 2.5 : 1.0; }
// Forward and backward together: pass_flop_factor(forward) + pass_flop_factor(backward) = 3.5.
constexpr double training_flop_factor() {
  return pass_flop_factor(Pass::forward) + pass_flop_factor(Pass::backward);
}

const char* version();

}  // namespace memeff
