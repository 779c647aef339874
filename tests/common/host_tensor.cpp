// Owning host tensors for tests (see host_tensor.h).
#include "common/host_tensor.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "core/numeric.h"

namespace memeff::test {

HostTensor::HostTensor(DType dtype, std::vector<std::int64_t> shape, Layout layout) {
  std::int64_t n = 1;
  for (std::int64_t s : shape) n *= s;
  storage.assign(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * dtype_size(dtype), 0);
  view.data = storage.data();
  view.dtype = dtype;
  view.rank = static_cast<int>(shape.size());
  for (int d = 0; d < view.rank; ++d) view.shape[d] = shape[d];
  std::int64_t stride = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    view.stride[d] = stride;
    stride *= std::max<std::int64_t>(shape[d], 1);
  }
  if (layout == Layout::blhd && view.rank == 4) {  // storage [B, L, H, D]
    const std::int64_t H = std::max<std::int64_t>(shape[1], 1),
                       L = std::max<std::int64_t>(shape[2], 1),
                       D = std::max<std::int64_t>(shape[3], 1);
    view.stride = {L * H * D, D, H * D, 1};
  }
}

HostTensor::HostTensor(const HostTensor& other) : storage(other.storage), view(other.view) {
  view.data = storage.data();
}

HostTensor& HostTensor::operator=(const HostTensor& other) {
  storage = other.storage;
  view = other.view;
  view.data = storage.data();
  return *this;
}

std::int64_t HostTensor::element_offset(std::int64_t flat) const {
  std::int64_t off = 0;
  for (int d = view.rank - 1; d >= 0; --d) {
    const std::int64_t s = view.shape[d];
    off += (flat % s) * view.stride[d];
    flat /= s;
  }
  return off;
}

double HostTensor::get(std::int64_t flat) const {
  return detail::load_as_double(view, element_offset(flat));
}

void HostTensor::set(std::int64_t flat, double value) {
  detail::store_from_double(view, element_offset(flat), value);
}

void fill_uniform(HostTensor& t, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
}

void fill_normal(HostTensor& t, std::mt19937_64& rng, double stddev) {
  std::normal_distribution<double> dist(0.0, stddev);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
}

HostTensor converted(const HostTensor& t, DType dtype, Layout layout) {
  std::vector<std::int64_t> shape(t.view.shape.begin(), t.view.shape.begin() + t.view.rank);
  HostTensor d(dtype, shape, layout);
  for (std::int64_t i = 0; i < t.numel(); ++i) d.set(i, t.get(i));
  return d;
}

void poison(HostTensor& t) { fill_value(t, std::numeric_limits<double>::quiet_NaN()); }

void fill_value(HostTensor& t, double value) {
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, value);
}

void fill_identity(HostTensor& t) {
  const std::int64_t rows = t.view.shape[t.view.rank - 2], cols = t.view.shape[t.view.rank - 1];
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, (i / cols) % rows == i % cols ? 1.0 : 0.0);
}

Diff compare(const HostTensor& actual, const HostTensor& expected) {
  Diff d;
  for (std::int64_t i = 0; i < expected.numel(); ++i) {
    const double a = actual.get(i), e = expected.get(i);
    if (std::isnan(a) || std::isfinite(a) != std::isfinite(e) || (!std::isfinite(e) && a != e)) {
      if (!d.nan) d.worst = i;
      d.nan = true;
      continue;
    }
    if (!std::isfinite(e)) continue;
    d.max_ref = std::max(d.max_ref, std::abs(e));
    const double diff = std::abs(a - e);
    if (diff > d.max_abs && !d.nan) {
      d.max_abs = diff;
      d.worst = i;
    }
  }
  return d;
}

std::string Diff::where(const HostTensor& t) const {
  if (worst < 0) return "[]";
  std::vector<std::int64_t> idx(static_cast<std::size_t>(t.view.rank));
  std::int64_t flat = worst;
  for (int d = t.view.rank - 1; d >= 0; --d) {
    idx[d] = flat % t.view.shape[d];
    flat /= t.view.shape[d];
  }
  std::ostringstream os;
  os << "[";
  for (std::size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
  os << "]";
  return os.str();
}

AttentionArgs attention_args(const HostTensor& q, const HostTensor& k, const HostTensor& v) {
  AttentionArgs a;
  a.q = q.view;
  a.k = k.view;
  a.v = v.view;
  return a;
}

}  // namespace memeff::test
