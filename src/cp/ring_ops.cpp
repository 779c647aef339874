// The ring's elementwise work on the host, and the dispatch to the CUDA versions for GPU views
// (see ring_ops.h). Host loops read and write through doubles: these passes are O(L·D) per rank
// against the attention's O(L²·D), and exact conversions keep the merge's rounding to the one
// store into the accumulator's dtype.
#include "cp/ring_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <string>

#include "core/numeric.h"
#include "memeff/error.h"

#if defined(MEMEFF_WITH_CUDA)
#include "cuda/runtime/device.h"
#include "cuda/runtime/workspace.h"
#endif

namespace memeff::cp::detail {
namespace {

using memeff::detail::load_as_double;
using memeff::detail::store_from_double;

// Shape and strides of a rank-3 or rank-4 view as four dimensions (a missing last one of size 1).
struct Dims4 {
  std::int64_t n[4] = {1, 1, 1, 1};
  std::int64_t s[4] = {0, 0, 0, 0};
  explicit Dims4(const TensorView& t) {
    for (int d = 0; d < t.rank; ++d) {
      n[d] = t.shape[d];
      s[d] = t.stride[d];
    }
  }
  std::int64_t rows() const { return n[0] * n[1] * n[2]; }
  // Offset of element e of flattened row r (r over the first three dimensions).
  std::int64_t offset(std::int64_t r, std::int64_t e) const {
    const std::int64_t i = r % n[2], h = (r / n[2]) % n[1], b = r / (n[2] * n[1]);
    return b * s[0] + h * s[1] + i * s[2] + e * s[3];
  }
};

void check_same_shape(const TensorView& a, const TensorView& b, const char* what) {
  bool same = a.rank == b.rank;
  for (int d = 0; same && d < a.rank; ++d) same = a.shape[d] == b.shape[d];
  if (!same) {
    throw Error(ErrorCode::internal, std::string("context parallel ") + what + ": shapes differ (" +
                                         a.describe() + " and " + b.describe() + ")");
  }
}

bool on_cuda(const TensorView& t) { return t.device.type == DeviceType::cuda; }

[[noreturn, maybe_unused]] void no_cuda() {
  throw Error(ErrorCode::unsupported, "context parallel: CUDA tensors, but this build has no CUDA");
}

#if !defined(MEMEFF_WITH_CUDA)
// A build without CUDA: the GPU versions the functions below hand CUDA views to only say so.
namespace cuda {
void fill(const TensorView&, double, void*) { no_cuda(); }
void copy(const TensorView&, const TensorView&, void*) { no_cuda(); }
void add(const TensorView&, const TensorView&, void*) { no_cuda(); }
void merge(const TensorView&, const TensorView&, const TensorView&, const TensorView&, void*) {
  no_cuda();
}
}  // namespace cuda
#endif

}  // namespace

DeviceBuffer::DeviceBuffer(Device device, std::size_t bytes, void* stream)
    : device_(device), stream_(stream) {
  if (bytes == 0) return;
  if (device.type == DeviceType::cpu) {
    data_ = ::operator new (bytes, std::align_val_t{kBufferAlign});
    return;
  }
#if defined(MEMEFF_WITH_CUDA)
  memeff::cuda::DeviceScope scope(device.index);
  data_ = memeff::cuda::stream_allocate("context-parallel ring", bytes,
                                        static_cast<cudaStream_t>(stream));
#else
  no_cuda();
#endif
}

DeviceBuffer::~DeviceBuffer() {
  if (!data_) return;
  if (device_.type == DeviceType::cpu) {
    ::operator delete (data_, std::align_val_t{kBufferAlign});
    return;
  }
#if defined(MEMEFF_WITH_CUDA)
  try {
    memeff::cuda::DeviceScope scope(device_.index);
    // Stream-ordered: after the ring's work.
    memeff::cuda::stream_free(data_, static_cast<cudaStream_t>(stream_));
  } catch (const Error&) {  // a destructor does not throw; the device could not be made current
  }
#endif
}

void fill(const TensorView& t, double value, void* stream) {
  if (on_cuda(t)) return cuda::fill(t, value, stream);
  const Dims4 d(t);
  for (std::int64_t r = 0; r < d.rows(); ++r)
    for (std::int64_t e = 0; e < d.n[3]; ++e) store_from_double(t, d.offset(r, e), value);
}

void copy(const TensorView& dst, const TensorView& src, void* stream) {
  check_same_shape(dst, src, "copy");
  if (on_cuda(dst)) return cuda::copy(dst, src, stream);
  const Dims4 dd(dst), sd(src);
  for (std::int64_t r = 0; r < dd.rows(); ++r)
    for (std::int64_t e = 0; e < dd.n[3]; ++e)
      store_from_double(dst, dd.offset(r, e), load_as_double(src, sd.offset(r, e)));
}

void add(const TensorView& acc, const TensorView& src, void* stream) {
  check_same_shape(acc, src, "add");
  if (on_cuda(acc)) return cuda::add(acc, src, stream);
  const Dims4 ad(acc), sd(src);
  for (std::int64_t r = 0; r < ad.rows(); ++r) {
    for (std::int64_t e = 0; e < ad.n[3]; ++e) {
      const std::int64_t o = ad.offset(r, e);
      store_from_double(acc, o, load_as_double(acc, o) + load_as_double(src, sd.offset(r, e)));
    }
  }
}

void merge(const TensorView& out_acc, const TensorView& lse_acc, const TensorView& out_part,
           const TensorView& lse_part, void* stream) {
  check_same_shape(out_acc, out_part, "merge");
  check_same_shape(lse_acc, lse_part, "merge");
  if (on_cuda(out_acc)) return cuda::merge(out_acc, lse_acc, out_part, lse_part, stream);
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  const Dims4 oa(out_acc), op(out_part), la(lse_acc), lp(lse_part);
  const std::int64_t width = oa.n[3];
  for (std::int64_t r = 0; r < oa.rows(); ++r) {
    const double part = load_as_double(lse_part, lp.offset(r, 0));
    if (part == kNegInf) continue;  // no visible key in this block: nothing to add
    const double acc = load_as_double(lse_acc, la.offset(r, 0));
    if (acc == kNegInf) {  // the first block this row sees: take it as it is
      for (std::int64_t e = 0; e < width; ++e) {
        store_from_double(out_acc, oa.offset(r, e), load_as_double(out_part, op.offset(r, e)));
      }
      store_from_double(lse_acc, la.offset(r, 0), part);
      continue;
    }
    // Weights exp(x - lse) <= 1, and log1p keeps the small term's digits. A NaN lse (a row whose
    // scores hold a NaN, docs/api.md) makes the merged row NaN: max and min would drop it.
    const double hi = std::max(acc, part), lo = std::min(acc, part);
    const double lse = std::isnan(acc) || std::isnan(part) ? std::numeric_limits<double>::quiet_NaN()
                                                           : hi + std::log1p(std::exp(lo - hi));
    const double w_acc = std::exp(acc - lse), w_part = std::exp(part - lse);
    for (std::int64_t e = 0; e < width; ++e) {
      const std::int64_t o = oa.offset(r, e);
      store_from_double(
          out_acc, o,
          w_acc * load_as_double(out_acc, o) + w_part * load_as_double(out_part, op.offset(r, e)));
    }
    store_from_double(lse_acc, la.offset(r, 0), lse);
  }
}

}  // namespace memeff::cp::detail
