// Host and device tensors, random inputs and comparisons of the memeff program (see
// cli_tensor.h): a counter-based normal generator, leading-box copies and max-error comparisons.
#include "cli_tensor.h"

#include <cmath>
#include <sstream>

#include "memeff/error.h"

namespace memeff::cli {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

TensorView make_view(void* data, DType dtype, Device device, const Shape& shape) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.rank = static_cast<int>(shape.dims.size());
  const auto strides = shape.strides();
  for (int d = 0; d < v.rank; ++d) {
    v.shape[d] = shape.dims[d];
    v.stride[d] = strides[d];
  }
  return v;
}

}  // namespace

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : dims) n *= d;
  return n;
}

std::array<std::int64_t, 4> Shape::strides() const {
  std::array<std::int64_t, 4> s{};
  std::int64_t stride = 1;
  for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
    s[d] = stride;
    stride *= std::max<std::int64_t>(dims[d], 1);
  }
  return s;
}

HostArray::HostArray(DType dtype_, Shape shape_)
    : dtype(dtype_), shape(std::move(shape_)),
      bytes(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype_)) {}

double HostArray::get(std::int64_t i) const { return load_element(bytes.data(), dtype, i); }

void HostArray::set(std::int64_t i, double value) { store_element(bytes.data(), dtype, i, value); }

TensorView HostArray::view() const {
  // Views of empty arrays still need a non-null pointer for validation.
  static unsigned char empty_sentinel[64];
  void* data = bytes.empty() ? empty_sentinel : const_cast<unsigned char*>(bytes.data());
  return make_view(data, dtype, Device::cpu(), shape);
}

void fill_normal(HostArray& a, std::uint64_t seed, std::uint64_t stream, double stddev) {
  const std::int64_t n = a.numel();
  const std::uint64_t base = splitmix64(seed ^ splitmix64(stream + 0x51ED27ull));
  constexpr double kTwoPi = 6.283185307179586;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t r = splitmix64(base + static_cast<std::uint64_t>(i));
    const double u1 = (static_cast<double>(r >> 40) + 1.0) / 16777217.0;  // (0, 1)
    const double u2 = static_cast<double>((r >> 16) & 0xFFFFFFu) / 16777216.0;
    a.set(i, stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2));
  }
}

namespace {

// Offset in `full` (row-major, contiguous) of the element at flat index `flat` of the box `box`.
struct BoxIndexer {
  std::vector<std::int64_t> box;
  std::array<std::int64_t, 4> full_strides{};
  BoxIndexer(const Shape& full, const std::vector<std::int64_t>& dims) : box(dims), full_strides(full.strides()) {
    if (dims.size() != full.dims.size()) throw Error(ErrorCode::internal, "box: rank mismatch");
    for (std::size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] > full.dims[d]) throw Error(ErrorCode::internal, "box: larger than the array");
    }
  }
  std::int64_t operator()(std::int64_t flat) const {
    std::int64_t offset = 0;
    for (int d = static_cast<int>(box.size()) - 1; d >= 0; --d) {
      const std::int64_t s = std::max<std::int64_t>(box[d], 1);
      offset += (flat % s) * full_strides[d];
      flat /= s;
    }
    return offset;
  }
};

}  // namespace

HostArray box_as(const HostArray& a, DType dtype, const std::vector<std::int64_t>& dims) {
  HostArray out(dtype, Shape{dims});
  const BoxIndexer index(a.shape, dims);
  const std::int64_t n = out.numel();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out.set(i, a.get(index(i)));
  return out;
}

DeviceTensor::DeviceTensor(Device device, DType dtype_, Shape shape_)
    : buffer(device, static_cast<std::size_t>(shape_.numel()) * dtype_size(dtype_)), dtype(dtype_),
      shape(std::move(shape_)) {}

std::size_t DeviceTensor::bytes() const { return static_cast<std::size_t>(shape.numel()) * dtype_size(dtype); }

TensorView DeviceTensor::view() const { return make_view(buffer.data(), dtype, buffer.device(), shape); }

TensorView DeviceTensor::box_view(const std::vector<std::int64_t>& dims) const {
  (void)BoxIndexer(shape, dims);  // checks the box fits
  TensorView v = view();
  for (std::size_t d = 0; d < dims.size(); ++d) v.shape[d] = dims[d];
  return v;
}

void DeviceTensor::upload(const HostArray& host) {
  if (host.dtype != dtype || host.numel() != shape.numel()) {
    throw Error(ErrorCode::internal, "DeviceTensor::upload: dtype or size mismatch");
  }
  buffer.upload(host.bytes.data(), host.bytes.size());
}

HostArray DeviceTensor::download() const {
  HostArray h(dtype, shape);
  buffer.download(h.bytes.data(), h.bytes.size());
  return h;
}

Comparison compare_box(const HostArray& actual, const HostArray& expected) {
  Comparison c;
  const BoxIndexer index(actual.shape, expected.shape.dims);
  const std::int64_t n = expected.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const double a = actual.get(index(i)), e = expected.get(i);
    if (!std::isfinite(a) || !std::isfinite(e)) {
      // Equal infinities (lse = -inf of an empty row) agree; anything else non-finite fails.
      if (a == e && !std::isnan(a)) continue;
      if (!c.nonfinite) c.worst = i;
      c.nonfinite = true;
      continue;
    }
    c.max_ref = std::max(c.max_ref, std::fabs(e));
    const double d = std::fabs(a - e);
    if (d > c.max_abs) {
      c.max_abs = d;
      if (!c.nonfinite) c.worst = i;
    }
  }
  return c;
}

std::string index_string(std::int64_t flat, const std::vector<std::int64_t>& dims) {
  std::vector<std::int64_t> idx(dims.size());
  for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
    const std::int64_t s = std::max<std::int64_t>(dims[d], 1);
    idx[d] = flat % s;
    flat /= s;
  }
  std::ostringstream os;
  os << "[";
  for (std::size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
  os << "]";
  return os.str();
}

}  // namespace memeff::cli
