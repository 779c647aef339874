// Non-owning tensor views and the small vocabulary types (dtype, device) of the public API.
// Nothing here depends on CUDA: device memory is a plain pointer plus a device ordinal.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace memeff {

// i32 is for index tensors (the packed sequences' cu_seqlens), never for attention data.
enum class DType : std::uint8_t { f32, f16, bf16, f64, i32 };

enum class DeviceType : std::uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int ordinal = 0) { return {DeviceType::cuda, ordinal}; }
  friend bool operator==(const Device&, const Device&) = default;
};

std::size_t dtype_size(DType dtype);
// One element of host memory holding `dtype` values, `index` elements from `data`: read as double,
// or written rounded to the dtype (round to nearest even for fp16 and bf16).
double load_element(const void* data, DType dtype, std::int64_t index);
void store_element(void* data, DType dtype, std::int64_t index, double value);
// The one spelling of each dtype ("fp32", "fp16", "bf16", "fp64", "int32"), in messages, the
// program's flags and reports; dtype_from_name is its inverse (nullopt for any other text).
const char* dtype_name(DType dtype);
std::optional<DType> dtype_from_name(std::string_view name);
std::string device_name(Device device);

// A view of up to four dimensions. Strides are in elements. Attention tensors are [B, H, L, D]
// with the last dimension contiguous (stride 1); the other strides are free, so [B, L, H, D]
// storage is viewed without a copy by permuting strides.
struct TensorView {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> stride{};

  // Row-major contiguous view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               Device device = Device::cpu());
  // Explicit strides (in elements), same length as shape.
  static TensorView strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                            std::initializer_list<std::int64_t> strides,
                            Device device = Device::cpu());

  bool defined() const { return rank > 0; }
  // Product of the sizes; 0 for an undefined view or a rank outside [1, kMaxRank], INT64_MAX
  // when the product overflows (validation rejects such views).
  std::int64_t numel() const;
  std::int64_t size(int dim) const { return shape[dim]; }
  // Element offset of an index tuple (as many indices as the rank).
  std::int64_t offset(std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0,
                      std::int64_t i3 = 0) const {
    return i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3];
  }
  std::string describe() const;  // "bf16[2, 8, 512, 64] on cuda:0"
};

}  // namespace memeff
