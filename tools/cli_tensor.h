// Tensors of the memeff program: contiguous [B, H, L, D] arrays on the host or a CUDA device,
// seeded random normal inputs, dtype conversions and the comparison `memeff run` reports. Host
// storage is the dtype's own bits, so the reference reads exactly the values the backend read.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cli_device.h"
#include "memeff/tensor.h"

namespace memeff::cli {

// Contiguous row-major shape of up to 4 dims.
struct Shape {
  std::vector<std::int64_t> dims;
  std::int64_t numel() const;
  std::array<std::int64_t, 4> strides() const;
};

// Host array in a storage dtype.
struct HostArray {
  DType dtype = DType::f32;
  Shape shape;
  std::vector<unsigned char> bytes;

  HostArray() = default;
  HostArray(DType dtype, Shape shape);
  std::int64_t numel() const { return shape.numel(); }
  double get(std::int64_t i) const;
  void set(std::int64_t i, double value);  // rounds to the dtype
  TensorView view() const;  // on the CPU
};

// Fills with N(0, stddev²) values rounded to the dtype, from a counter-based generator keyed by
// (seed, stream): the same seed gives the same inputs on every machine.
void fill_normal(HostArray& a, std::uint64_t seed, std::uint64_t stream, double stddev = 1.0);

// The leading box of `a` with shape `dims` (index [0, dims[d]) along each dimension; batch 0,
// heads 0..n-1, rows 0..r-1 ...), converted to `dtype`, stored contiguously.
HostArray box_as(const HostArray& a, DType dtype, const std::vector<std::int64_t>& dims);

// A contiguous tensor in a Buffer on some device.
struct DeviceTensor {
  Buffer buffer;
  DType dtype = DType::f32;
  Shape shape;

  DeviceTensor() = default;
  DeviceTensor(Device device, DType dtype, Shape shape);
  std::size_t bytes() const;
  TensorView view() const;
  // A view of the leading box `dims` (see box_as) with this tensor's strides: no copy.
  TensorView box_view(const std::vector<std::int64_t>& dims) const;
  void upload(const HostArray& host);
  HostArray download() const;
};

// Max |actual - expected| over the elements of `expected`, which holds the leading box of
// `actual` (see box_as); max |expected|; whether a NaN or a non-finite mismatch was seen.
struct Comparison {
  double max_abs = 0.0;
  double max_ref = 0.0;
  bool nonfinite = false;
  std::int64_t worst = -1;  // flat index of the largest difference (or the first non-finite one)
};
Comparison compare_box(const HostArray& actual, const HostArray& expected);
// "[b, h, i, d]" of a flat index in a shape.
std::string index_string(std::int64_t flat, const std::vector<std::int64_t>& dims);

}  // namespace memeff::cli
