// Owning host tensors for tests: allocation in [B, H, L, D] or [B, L, H, D] storage, random
// fill, NaN poisoning and comparisons. Tolerances live in tests/common/tolerance.h.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "memeff/attention.h"
#include "memeff/tensor.h"

namespace memeff::test {

enum class Layout { bhld, blhd };

struct HostTensor {
  std::vector<std::uint8_t> storage;
  TensorView view;

  HostTensor() = default;
  HostTensor(DType dtype, std::vector<std::int64_t> shape, Layout layout = Layout::bhld);
  HostTensor(const HostTensor& other);
  HostTensor& operator=(const HostTensor& other);

  std::int64_t numel() const { return view.numel(); }
  double get(std::int64_t flat) const;        // logical row-major index
  void set(std::int64_t flat, double value);  // rounds to the dtype
  std::int64_t element_offset(std::int64_t flat) const;
};

// Uniform values in [lo, hi), rounded to the tensor's dtype.
void fill_uniform(HostTensor& t, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0);
void fill_normal(HostTensor& t, std::mt19937_64& rng, double stddev = 1.0);
// The same values in another dtype and/or layout (rounded to the new dtype).
HostTensor converted(const HostTensor& t, DType dtype, Layout layout = Layout::bhld);
// Every element NaN (outputs are poisoned before each run so unwritten elements fail).
void poison(HostTensor& t);
// Every element `value`.
void fill_value(HostTensor& t, double value);
// The last two dimensions as identity matrices: element [..., i, e] is 1 where i == e, else 0
// (V = I with Dv >= Lk makes out[i, j] the weight of key j in row i).
void fill_identity(HostTensor& t);

// Attention arguments over the views of q, k and v; the other fields keep their defaults.
AttentionArgs attention_args(const HostTensor& q, const HostTensor& k, const HostTensor& v);

struct Diff {
  double max_abs = 0.0;                          // max |a - b|
  double max_ref = 0.0;                          // max |b|
  std::int64_t worst = -1;                       // logical index of the largest difference
  bool nan = false;                              // a NaN in a or a mismatch of non-finite values
  std::string where(const HostTensor& t) const;  // "[b, h, i, d]" of the worst element
};
Diff compare(const HostTensor& actual, const HostTensor& expected);

}  // namespace memeff::test
