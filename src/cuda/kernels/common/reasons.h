// The host-side checks both fused kernel families make of their params before a launch, in one
// place: the grid's limits, head-dim buckets, 16-byte alignment of pointers and strides (the
// kernels load 16-byte vectors with cp.async or TMA), the GQA group and the softcap's range. Each
// family adds its own (compute capability, grid bounds of its tiles, coordinate widths) in its
// launchers.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "cuda/kernels/common/params.h"

namespace memeff::cuda {

// What a family's host code needs to know of the device it launches on.
struct DeviceCaps {
  int major = 0, minor = 0;
  int multiprocessors = 0;  // SMs (the persistent sm90 grid's size)
};

// CUDA's grid limits: blocks along x, and along y or z.
inline constexpr std::int64_t kMaxGridX = (std::int64_t{1} << 31) - 1;
inline constexpr std::int64_t kMaxGridY = 65535;

// Head-dim buckets with a compiled kernel, ascending; D and Dv up to a bucket are zero-padded.
template <int... kDims>
struct HeadDims {
  static constexpr int values[sizeof...(kDims)] = {kDims...};
  static constexpr int largest = values[sizeof...(kDims) - 1];
  // The smallest bucket that holds head dim d, or 0 when none does.
  static constexpr int bucket_of(int d) {
    for (int bucket : values) {
      if (d <= bucket) return bucket;
    }
    return 0;
  }
};

inline bool aligned16(const void* ptr) {
  return (reinterpret_cast<std::uintptr_t>(ptr) & 15u) == 0;
}

// "q strides (..) are not all multiples of `multiple` elements (why)" when one of b, h, l is not.
inline void check_strides(std::vector<std::string>& reasons, const char* name, const Strides& s,
                          int multiple = 8, const char* why = "16-byte vector loads") {
  if (s.b % multiple != 0 || s.h % multiple != 0 || s.l % multiple != 0) {
    reasons.push_back(
        std::string(name) + " strides (" + std::to_string(s.b) + ", " + std::to_string(s.h) + ", " +
        std::to_string(s.l) + ") are not all " +
        (multiple == 2 ? "even" : "multiples of " + std::to_string(multiple) + " elements") + " (" +
        why + ")");
  }
}

// The checks of every fused forward and backward: D and Dv multiples of 8 within the family's
// largest bucket `max_head_dim`, q, k, v and out on 16-byte boundaries (`note` says what needs
// it) with strides in whole 16-byte vectors, and Hq a multiple of Hkv. Pointers are null while
// only the problem is known (dispatch): they pass, and are checked again with the views.
inline void add_common_reasons(std::vector<std::string>& reasons, const ForwardParams& p,
                               int max_head_dim, const char* note = "") {
  const std::string range = " is not a multiple of 8 up to " + std::to_string(max_head_dim);
  if (p.D <= 0 || p.D % 8 != 0 || p.D > max_head_dim) {
    reasons.push_back("head dim D = " + std::to_string(p.D) + range);
  }
  if (p.Dv <= 0 || p.Dv % 8 != 0 || p.Dv > max_head_dim) {
    reasons.push_back("value head dim Dv = " + std::to_string(p.Dv) + range);
  }
  for (const void* ptr : std::initializer_list<const void*>{p.q, p.k, p.v, p.out}) {
    if (!aligned16(ptr)) {
      reasons.push_back(std::string("q, k, v and out must start on 16-byte boundaries") + note);
      break;
    }
  }
  check_strides(reasons, "q", p.q_stride);
  check_strides(reasons, "k", p.k_stride);
  check_strides(reasons, "v", p.v_stride);
  check_strides(reasons, "out", p.out_stride);
  if (p.group <= 0 || p.Hkv <= 0 || p.Hq != p.Hkv * p.group) {
    reasons.push_back("Hq must be a multiple of Hkv (GQA group)");
  }
}

// The backward's: those of the forward, and dout with them; the gradients dq, dk, dv on 16-byte
// boundaries with strides that are multiples of `grad_multiple` elements (8: 16-byte stores; 2:
// paired 4-byte stores).
inline void add_common_reasons(std::vector<std::string>& reasons, const BackwardParams& p,
                               int max_head_dim, const char* note, int grad_multiple) {
  add_common_reasons(reasons, static_cast<const ForwardParams&>(p), max_head_dim, note);
  for (const void* ptr : std::initializer_list<const void*>{p.dout, p.dq, p.dk, p.dv}) {
    if (!aligned16(ptr)) {
      reasons.push_back(std::string("dout, dq, dk and dv must start on 16-byte boundaries") + note);
      break;
    }
  }
  check_strides(reasons, "dout", p.dout_stride);
  const char* why = grad_multiple == 2 ? "paired 4-byte stores" : "16-byte stores";
  check_strides(reasons, "dq", p.dq_stride, grad_multiple, why);
  check_strides(reasons, "dk", p.dk_stride, grad_multiple, why);
  check_strides(reasons, "dv", p.dv_stride, grad_multiple, why);
}

// A dense backward's grid (band, key blocks of block_n keys, B·Hkv / band) (common/block_order.h):
// at most 65535 key blocks (y) and (batch, kv head) pairs (z, with a band of 1).
inline void add_dense_backward_grid_reasons(std::vector<std::string>& reasons,
                                            const BackwardParams& p, int block_n) {
  const std::int64_t heads = static_cast<std::int64_t>(p.B) * p.Hkv;
  if (heads > kMaxGridY) {
    reasons.push_back("B·Hkv = " + std::to_string(heads) +
                      " exceeds the grid's 65535 (batch, kv head) blocks");
  }
  if ((p.Lk + block_n - 1) / block_n > kMaxGridY) {
    reasons.push_back("Lk = " + std::to_string(p.Lk) + " exceeds the grid's 65535 key blocks of " +
                      std::to_string(block_n) +
                      " keys (a dense call; packed sequences have no such bound)");
  }
}

// The softcap's factors scale / softcap and softcap / scale (ScoreMods) must be normal fp32
// numbers: the kernels of both families multiply by them with denormals flushed.
inline void add_score_modifier_reasons(std::vector<std::string>& reasons, const ForwardParams& p) {
  if (!(p.mods.flags & ScoreMods::kSoftcap)) return;
  auto normal = [](float x) { return std::fpclassify(x) == FP_NORMAL; };
  if (!normal(p.mods.softcap_in) || !normal(p.mods.softcap_out) || !normal(p.mods.softcap_exp2)) {
    reasons.push_back("softcap / scale = " + std::to_string(p.mods.softcap_out) +
                      " is outside fp32's normal range (the kernels keep scores in units of q·k)");
  }
}

}  // namespace memeff::cuda
