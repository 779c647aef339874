// Checks shared by the forward and backward launchers: head-dim buckets, 16-byte alignment of
// pointers and strides (the kernels load 16-byte vectors with cp.async).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "cuda/params.h"

namespace memeff::cuda {

// The smallest compiled bucket that holds head dim d, or 0 when none does.
template <class Buckets>
int head_dim_bucket(const Buckets& buckets, int d) {
  for (int bucket : buckets) {
    if (d <= bucket) return bucket;
  }
  return 0;
}

inline bool aligned16(const void* ptr) {
  return (reinterpret_cast<std::uintptr_t>(ptr) & 15u) == 0;
}

// Adds `reason` when one of the pointers (null ones are unknown yet: skipped) is not 16-byte
// aligned.
inline void check_aligned16(std::vector<std::string>& reasons,
                            std::initializer_list<const void*> ptrs, const char* reason) {
  for (const void* ptr : ptrs) {
    if (ptr != nullptr && !aligned16(ptr)) {
      reasons.push_back(reason);
      return;
    }
  }
}

// Adds a reason when a tensor's B/H/L strides are not multiples of 8 elements.
inline void check_strides(std::vector<std::string>& reasons, const char* name, const Strides& s) {
  if (s.b % 8 != 0 || s.h % 8 != 0 || s.l % 8 != 0) {
    reasons.push_back(std::string(name) + " strides (" + std::to_string(s.b) + ", " +
                      std::to_string(s.h) + ", " + std::to_string(s.l) +
                      ") are not all multiples of 8 elements (16-byte vector loads)");
  }
}

}  // namespace memeff::cuda
