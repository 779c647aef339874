// The definitions behind memeff/tensor.h and the names in memeff/attention.h: TensorView's
// constructors and description, element access by dtype, the spellings of dtypes, devices,
// causal modes and error codes (one each, for messages and parsing), and the FLOP formulas.
#include "memeff/tensor.h"

#include <algorithm>
#include <limits>
#include <sstream>
#include <vector>

#include "core/numeric.h"
#include "core/visible_keys.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/error.h"

namespace memeff {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f64: return 8;
    case DType::i32: return 4;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "fp32";
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::f64: return "fp64";
    case DType::i32: return "int32";
  }
  return "unknown";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType d : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i32}) {
    if (name == dtype_name(d)) return d;
  }
  return std::nullopt;
}

double load_element(const void* data, DType dtype, std::int64_t index) {
  TensorView v;
  v.data = const_cast<void*>(data);
  v.dtype = dtype;
  return detail::load_as_double(v, index);
}

void store_element(void* data, DType dtype, std::int64_t index, double value) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  detail::store_from_double(v, index, value);
}

std::string device_name(Device device) {
  if (device.type == DeviceType::cpu) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

const char* causal_mode_name(CausalMode mode) {
  switch (mode) {
    case CausalMode::none: return "none";
    case CausalMode::top_left: return "top_left";
    case CausalMode::bottom_right: return "bottom_right";
  }
  return "unknown";
}

std::optional<CausalMode> causal_mode_from_name(std::string_view name) {
  for (CausalMode m : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    if (name == causal_mode_name(m)) return m;
  }
  return std::nullopt;
}

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::cuda_error: return "cuda_error";
    case ErrorCode::io_error: return "io_error";
    case ErrorCode::internal: return "internal";
  }
  return "unknown";
}

TensorView TensorView::contiguous(void* data, DType dtype,
                                  std::initializer_list<std::int64_t> shape, Device device) {
  if (shape.size() > static_cast<std::size_t>(kMaxRank) || shape.size() == 0) {
    throw Error(ErrorCode::invalid_argument,
                "TensorView::contiguous: expected a rank between 1 and 4, got " +
                    std::to_string(shape.size()));
  }
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.rank = static_cast<int>(shape.size());
  int d = 0;
  for (std::int64_t s : shape) view.shape[d++] = s;
  std::int64_t stride = 1;
  for (int i = view.rank - 1; i >= 0; --i) {
    view.stride[i] = stride;
    stride *= view.shape[i] > 0 ? view.shape[i] : 1;
  }
  return view;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               std::initializer_list<std::int64_t> strides, Device device) {
  if (shape.size() != strides.size()) {
    throw Error(ErrorCode::invalid_argument,
                "TensorView::strided: shape has " + std::to_string(shape.size()) +
                    " dimensions but strides has " + std::to_string(strides.size()));
  }
  TensorView view = contiguous(data, dtype, shape, device);
  int d = 0;
  for (std::int64_t s : strides) view.stride[d++] = s;
  return view;
}

std::int64_t TensorView::numel() const {
  if (rank <= 0 || rank > kMaxRank) return 0;
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    if (__builtin_mul_overflow(n, shape[i], &n)) return std::numeric_limits<std::int64_t>::max();
  }
  return n;
}

std::string TensorView::describe() const {
  std::ostringstream os;
  if (rank < 0 || rank > kMaxRank) {
    os << dtype_name(dtype) << " view of invalid rank " << rank << " on " << device_name(device);
    return os.str();
  }
  os << dtype_name(dtype) << "[";
  for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << shape[i];
  os << "] strides [";
  for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << stride[i];
  os << "] on " << device_name(device);
  return os.str();
}

double attention_flops(std::int64_t B, std::int64_t Hq, std::int64_t Lq, std::int64_t Lk,
                       std::int64_t D, CausalMode causal) {
  const double f = 4.0 * static_cast<double>(B) * static_cast<double>(Hq) *
                   static_cast<double>(Lq) * static_cast<double>(Lk) * static_cast<double>(D);
  return causal == CausalMode::none ? f : 0.5 * f;
}

std::int64_t visible_pairs(std::int64_t Lq, std::int64_t Lk, CausalMode causal,
                           const Window& window) {
  // Problem::position_shift() of a call without global coordinates.
  const std::int64_t shift = causal == CausalMode::top_left ? 0 : Lk - Lq;
  const auto cap = [](std::int64_t side) { return std::min(side, Problem::kWindowCap); };
  std::int64_t pairs = 0;
  for (std::int64_t i = 0; i < Lq; ++i) {
    pairs += detail::visible_key_span(i, Lk, causal != CausalMode::none, shift, cap(window.left),
                                      cap(window.right))
                 .size();
  }
  return pairs;
}

double attention_flops(std::int64_t B, std::int64_t Hq, std::int64_t Lq, std::int64_t Lk,
                       std::int64_t D, CausalMode causal, const Window& window) {
  if (!window.bounded()) return attention_flops(B, Hq, Lq, Lk, D, causal);
  return 4.0 * static_cast<double>(B) * static_cast<double>(Hq) * static_cast<double>(D) *
         static_cast<double>(visible_pairs(Lq, Lk, causal, window));
}

double attention_flops_packed(const std::vector<std::int64_t>& seqlens_q,
                              const std::vector<std::int64_t>& seqlens_k, std::int64_t Hq,
                              std::int64_t D, CausalMode causal, const Window& window) {
  if (seqlens_q.size() != seqlens_k.size()) {
    throw Error(ErrorCode::invalid_argument,
                "argument `seqlens_k`: expected " + std::to_string(seqlens_q.size()) +
                    " lengths (as seqlens_q), got " + std::to_string(seqlens_k.size()));
  }
  double total = 0.0;
  for (std::size_t s = 0; s < seqlens_q.size(); ++s) {
    total += attention_flops(1, Hq, seqlens_q[s], seqlens_k[s], D, causal, window);
  }
  return total;
}

const char* version() { return MEMEFF_VERSION; }

}  // namespace memeff
