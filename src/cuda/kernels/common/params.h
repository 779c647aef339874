// The plain parameter structs the CUDA kernels receive by value: pointers, int64 strides in
// elements (the last dimension is always contiguous), sizes, typed modes and the RNG state.
// Built from a validated Problem (src/cuda/runtime/problem_params.h); no framework or API types
// reach device code.
#pragma once

#include <cstdint>

#include "core/hostdevice.h"

namespace memeff::cuda {

// The element type of q, k, v, out and the gradients (the fused kernels take these two).
enum class ElemType { bf16, fp16 };

// The causal mask (memeff::CausalMode in the kernels' terms; int-sized, as the params' layout was
// measured with it).
enum class Causal : int {
  none,
  top_left,      // query i sees keys j <= i + causal_shift (q_start - k_start)
  bottom_right,  // query i sees keys j <= i + (Lk - Lq): per sequence in packed calls
};

// How a backward writes dbias: not at all, directly (dbias has the full [B, Hq, Lq, Lk] extent:
// dS as it is), or reduced (it broadcasts over some of B, H, Lq: fp32 atomics into an
// accumulator, then a conversion).
enum class DbiasMode : int { none, direct, reduced };

// Sliding window, ALiBi and softcapping (docs/window.md): what the fused sm90 and sm80 kernels and
// the split-KV forward read of them. Query i's diagonal is key i + causal_shift (ForwardParams;
// per sequence when packed). `flags` says which are on, so a kernel tests one word per tile (or
// picks its modifiers' instantiation by it) and a call without any runs the code it ran before
// them.
struct ScoreMods {
  static constexpr int kSoftcap = 1, kAlibi = 2, kWindow = 4;
  // A window side that bounds nothing (Problem::kWindowCap: beyond every distance of a call).
  static constexpr std::int64_t kUnbounded = std::int64_t{1} << 40;
  int flags = 0;
  // kWindow (a left bound, or a right bound without a causal mask): query i sees keys
  // i + shift - left_reach .. i + shift + right_reach (and j < Lk); kUnbounded for a side without
  // a bound. A causal mask caps the right side at 0 (KeyMask applies it).
  std::int64_t left_reach = kUnbounded, right_reach = kUnbounded;
  // kAlibi: score -= slope·|i + shift - j| with the slope of (b, h) (b: the sequence when packed)
  // at alibi_slopes[b·alibi_stride_b + h·alibi_stride_h] (fp32; stride_b 0 for slopes [Hq]).
  const float* alibi_slopes = nullptr;
  std::int64_t alibi_stride_b = 0, alibi_stride_h = 0;
  // kSoftcap: the kernels keep scores as s = q·k (times scale later); the cap replaces s by
  // tanh(s·softcap_in)·softcap_out = softcap·tanh(scale·s / softcap) / scale, so whatever follows
  // (scale, bias, the log2 domain) is unchanged. softcap_in = scale / softcap, softcap_out its
  // inverse, softcap_exp2 = 2·log2(e)·softcap_in (tanh from exp2); off where scale is 0 (the cap
  // of 0 is 0).
  float softcap_in = 0.0f, softcap_out = 0.0f, softcap_exp2 = 0.0f;
};

// Strides of a [B, H, L, last] tensor in elements; the last dimension has stride 1.
// Broadcast dimensions (bias) have stride 0.
struct Strides {
  std::int64_t b = 0, h = 0, l = 0;
};

struct ForwardParams {
  const void* q = nullptr;     // [B, Hq, Lq, D]
  const void* k = nullptr;     // [B, Hkv, Lk, D]
  const void* v = nullptr;     // [B, Hkv, Lk, Dv]
  const void* bias = nullptr;  // broadcast to [B, Hq, Lq, Lk]; null when absent
  void* out = nullptr;         // [B, Hq, Lq, Dv], dtype of q
  float* lse = nullptr;        // [B, Hq, Lq], natural log; -inf for rows that see no key
  Strides q_stride, k_stride, v_stride, bias_stride, out_stride;
  std::int64_t lse_stride_b = 0, lse_stride_h = 0;  // lse's row stride is 1

  int B = 0, Hq = 0, Hkv = 0;
  int group = 1;  // Hq / Hkv: query heads per key/value head
  std::int64_t Lq = 0, Lk = 0;
  int D = 0, Dv = 0;
  bool bias_is_fp32 = false;  // bias dtype: fp32, else the dtype of q

  float scale = 1.0f;       // softmax scale applied to q·k
  float scale_log2 = 1.0f;  // scale · log2(e), for exp2-based softmax
  Causal causal = Causal::none;
  // Query i's diagonal key, i + causal_shift (Problem::position_shift): a causal mask shows keys
  // j <= i + causal_shift; the window and ALiBi measure from it also without one (Lk - Lq then).
  std::int64_t causal_shift = 0;

  // Dropout (docs/dropout.md): keep when byte < keep_threshold; kept values scaled by keep_scale.
  bool has_dropout = false;
  std::uint32_t keep_threshold = 256;
  float keep_scale = 1.0f;
  std::uint64_t seed = 0, offset = 0;
  // When non-null, the kernels read seed/offset from device memory (CUDA-graph replays).
  const std::uint64_t* seed_ptr = nullptr;
  const std::uint64_t* offset_ptr = nullptr;

  // Packed sequences (null when dense; common/varlen.cuh reads them). Then B is the number of
  // sequences, Lq and Lk their maximum lengths, the b strides of q, k, v, out (dout, dq, dk, dv)
  // and lse are 0, and sequence b's row r is the packed row cu_seqlens_q[b] + r (keys:
  // cu_seqlens_k[b] + r), r < its own length; offsets are clamped into [0, total_q|total_k].
  // The diagonal is per sequence (Lk_b - Lq_b but top-left: 0); causal_shift above is unused.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  std::int64_t total_q = 0, total_k = 0;

  // Global coordinates (Problem::q_start, k_start, kv_block; dense calls only, zero otherwise):
  // query row i and key j draw the dropout map's row q_start + i and key k_start + j, whose
  // 64-key block is k_block64 + j / 64 (k_start is a multiple of 64 when dropping: the kernels
  // draw whole blocks). causal_shift above already holds q_start - k_start. kv_block: the
  // backward's out and lse are a larger attention's, so no row's dS is zeroed for seeing a
  // single key of this call (it may see more elsewhere). 32-bit like the map's counter words
  // (validation keeps q_start + Lq <= 2^32 and k_start + Lk <= 2^36). Register pressure decides
  // the width of each kernel's sums: 32-bit in the sm80 backward (64-bit ones spilled), 64-bit
  // in the sm90 backward (32-bit casts spilled); either gives the same counter words.
  std::uint32_t q_start = 0;
  std::uint32_t k_block64 = 0;
  bool kv_block = false;

  ScoreMods mods;  // window, ALiBi, softcap (flags 0: none)
};

struct BackwardParams : ForwardParams {
  const void* dout = nullptr;  // [B, Hq, Lq, Dv]
  void* dq = nullptr;          // [B, Hq, Lq, D]
  void* dk = nullptr;          // [B, Hkv, Lk, D]
  void* dv = nullptr;          // [B, Hkv, Lk, Dv]
  void* dbias = nullptr;  // the bias's own shape (bias_stride / dbias_stride); null if unwanted
  Strides dout_stride, dq_stride, dk_stride, dv_stride, dbias_stride;
  int dbias_shape[3] = {0, 0, 0};  // sizes of dbias along B, H, Lq (1 where broadcast)

  // Workspace (carved by the launcher from Options::workspace or its own allocation).
  float* softmax_d = nullptr;  // [B, Hq, Lq]: rowsum(dO ∘ O), contiguous
  float* dq_accum = nullptr;   // [B, Hq, Lq, D] fp32, contiguous
  bool deterministic = false;
};

MEMEFF_HD bool is_causal(const ForwardParams& p) { return p.causal != Causal::none; }

// Whether the blocks of a head differ in cost along the diagonal: a bound on one side of it only
// (the causal mask, or a window's right side) moves the keys a query block sees, and the queries a
// key block is seen by, with the block; bounds on both sides, or none, keep their count.
inline bool block_costs_vary(const ForwardParams& p) {
  const bool right = is_causal(p) || p.mods.right_reach < ScoreMods::kUnbounded;
  const bool left = p.mods.left_reach < ScoreMods::kUnbounded;
  return right != left;
}

// Whether dbias sums over a broadcast dimension (B, H or Lq of size 1 where the problem's is not):
// then it goes through an fp32 accumulator and a conversion.
inline bool dbias_is_reduced(const BackwardParams& p) {
  return p.dbias_shape[0] > 0 &&
         ((p.dbias_shape[0] == 1 && p.B > 1) || (p.dbias_shape[1] == 1 && p.Hq > 1) ||
          (p.dbias_shape[2] == 1 && p.Lq > 1));
}
// How a backward's dbias is written, and its fp32 accumulator (DbiasMode::reduced).
struct DbiasPlan {
  DbiasMode mode = DbiasMode::none;  // none when dbias is not given
  std::int64_t accum_elems = 0;      // the accumulator [dB, dH, dL, Lk] when mode is reduced
  // What a workspace reserves for it: also before dbias itself is given (workspace sizes are
  // asked with the problem alone, whose dbias_shape says whether it would be reduced).
  std::int64_t reserved_elems = 0;
};
inline DbiasPlan dbias_plan(const BackwardParams& p) {
  DbiasPlan plan;
  if (!dbias_is_reduced(p)) {
    if (p.dbias != nullptr) plan.mode = DbiasMode::direct;
    return plan;
  }
  plan.reserved_elems =
      static_cast<std::int64_t>(p.dbias_shape[0]) * p.dbias_shape[1] * p.dbias_shape[2] * p.Lk;
  if (p.dbias != nullptr) {
    plan.mode = DbiasMode::reduced;
    plan.accum_elems = plan.reserved_elems;
  }
  return plan;
}

// Whether that sum crosses the kernels' CTAs, which own one (batch, kv head): over the batch, or
// over heads of different kv heads. A deterministic backward then runs one CTA per launch.
inline bool dbias_reduced_across_ctas(const BackwardParams& p) {
  return p.dbias_shape[0] > 0 &&
         ((p.dbias_shape[0] == 1 && p.B > 1) || (p.dbias_shape[1] == 1 && p.Hkv > 1));
}

}  // namespace memeff::cuda
