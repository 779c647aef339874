// The cpu backend: memory-efficient attention on the host. Forward is a tiled online softmax
// (running max and sum, rescaled accumulator); backward is FlashAttention-2 style, recomputing P
// from lse and regenerating the dropout mask from the shared RNG contract, never storing it.
//
// Tiles: kBrFwd (forward) or kBr (backward) query rows × 64 keys; the key tile is the dropout
// map's 64-column block, so a row's keep-bits for a tile are one 64-bit word. Forward threads take
// (b, h, query block) items; backward threads take the key blocks of one (b, kv head) at a time,
// each owning its dK/dV tile and its dbias columns, with per-thread dQ partials summed after each
// kv head. A sliding window (docs/window.md) bounds both loops: key tiles no row of a query tile
// sees, and query tiles no key of a key tile is seen by, are skipped, so the work grows with the
// window rather than with Lk.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "core/builtin_backends.h"
#include "core/dropout_map.h"
#include "core/numeric.h"
#include "core/packed.h"
#include "core/score_modifiers.h"
#include "core/visible_keys.h"
#include "cpu/simd_kernels.h"
#include "memeff/backend.h"
#include "memeff/error.h"

namespace memeff::detail {
namespace {

constexpr int kBr = 60;  // query rows per backward tile (a multiple of the 6- and 12-row blocks)
// Forward query rows per tile (a multiple of the 6- and 12-row blocks); K and V are packed once
// per tile, so taller tiles pack less often.
constexpr int kBrFwd = 240;
constexpr int kBc = kCpuKeyTile;           // keys per tile (= dropout column block)
constexpr std::int64_t kMaxHeadDim = 512;  // per-thread tiles grow with D; beyond: reference
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr std::size_t kAlign = 64;  // scratch arrays start on cache lines

std::int64_t round_up(std::int64_t x, std::int64_t q) { return (x + q - 1) / q * q; }

// Writes 0 to every element of a rank-4 view.
void zero_view(const TensorView& t) {
  for (std::int64_t b = 0; b < t.shape[0]; ++b)
    for (std::int64_t h = 0; h < t.shape[1]; ++h)
      for (std::int64_t i = 0; i < t.shape[2]; ++i)
        for (std::int64_t j = 0; j < t.shape[3]; ++j)
          store_from_double(t, t.offset(b, h, i, j), 0.0);
}

// Converts n elements of a row (contiguous) to fp32.
void load_row(const TensorView& t, std::int64_t offset, std::int64_t n, float* dst) {
  if (n == 0) return;  // Dv = 0: the view may be null
  switch (t.dtype) {
    case DType::f32:
      std::memcpy(dst, static_cast<const float*>(t.data) + offset, n * sizeof(float));
      break;
    case DType::f64: {
      const double* src = static_cast<const double*>(t.data) + offset;
      for (std::int64_t e = 0; e < n; ++e) dst[e] = static_cast<float>(src[e]);
      break;
    }
    case DType::bf16: {
      const std::uint16_t* src = static_cast<const std::uint16_t*>(t.data) + offset;
      for (std::int64_t e = 0; e < n; ++e) dst[e] = bf16_to_float(src[e]);
      break;
    }
    case DType::f16: {
      const std::uint16_t* src = static_cast<const std::uint16_t*>(t.data) + offset;
      for (std::int64_t e = 0; e < n; ++e) dst[e] = fp16_to_float(src[e]);
      break;
    }
    case DType::i32: break;  // index tensors are never attention data (validation)
  }
}

void store_row(const TensorView& t, std::int64_t offset, std::int64_t n, const float* src,
               float factor) {
  if (n == 0) return;  // Dv = 0: the view may be null
  switch (t.dtype) {
    case DType::f32: {
      float* dst = static_cast<float*>(t.data) + offset;
      for (std::int64_t e = 0; e < n; ++e) dst[e] = src[e] * factor;
      break;
    }
    case DType::f64: {
      double* dst = static_cast<double*>(t.data) + offset;
      for (std::int64_t e = 0; e < n; ++e) dst[e] = src[e] * factor;
      break;
    }
    case DType::bf16: {
      std::uint16_t* dst = static_cast<std::uint16_t*>(t.data) + offset;
      for (std::int64_t e = 0; e < n; ++e) dst[e] = float_to_bf16(src[e] * factor);
      break;
    }
    case DType::f16: {
      std::uint16_t* dst = static_cast<std::uint16_t*>(t.data) + offset;
      for (std::int64_t e = 0; e < n; ++e) dst[e] = float_to_fp16(src[e] * factor);
      break;
    }
    case DType::i32: break;
  }
}

// Carves 64-byte aligned float arrays out of one block.
class Arena {
 public:
  Arena(void* base, std::size_t bytes) : base_(static_cast<std::byte*>(base)), bytes_(bytes) {}
  float* floats(std::int64_t n) {
    return static_cast<float*>(take(static_cast<std::size_t>(n) * sizeof(float)));
  }
  std::uint64_t* words(std::int64_t n) {
    return static_cast<std::uint64_t*>(take(static_cast<std::size_t>(n) * sizeof(std::uint64_t)));
  }
  static std::size_t padded(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

 private:
  void* take(std::size_t bytes) {
    bytes = padded(bytes);
    if (used_ + bytes > bytes_) throw Error(ErrorCode::internal, "cpu backend: workspace overrun");
    void* p = base_ + used_;
    used_ += bytes;
    return p;
  }
  std::byte* base_;
  std::size_t bytes_;
  std::size_t used_ = 0;
};

// Per-thread tile sizes (in floats / words) of each pass, shared by workspace_bytes and the
// passes so the two cannot disagree.
struct Dims {
  std::int64_t D, Dv, Dp, Dvp;  // head dims and their padding to the product quantum
  // Query rows a forward tile holds: kBrFwd, or Lq when fewer (a 16-row call then takes 25 KiB
  // of scratch per thread instead of 216 KiB).
  std::int64_t fwd_rows;
  explicit Dims(const Problem& pb)
      : D(pb.D),
        Dv(pb.Dv),
        Dp(round_up(std::max<std::int64_t>(pb.D, 1), kCpuColumnQuantum)),
        Dvp(round_up(std::max<std::int64_t>(pb.Dv, 1), kCpuColumnQuantum)),
        fwd_rows(std::clamp<std::int64_t>(pb.Lq, 1, kBrFwd)) {}
};

std::size_t forward_thread_bytes(const Dims& d) {
  const std::size_t f = sizeof(float), w = sizeof(std::uint64_t);
  const auto r = static_cast<std::size_t>(d.fwd_rows);
  return Arena::padded(r * d.Dp * f)       // Q tile
         + Arena::padded(d.Dp * kBc * f)   // Kᵀ tile
         + Arena::padded(kBc * d.Dvp * f)  // V tile
         + Arena::padded(r * kBc * f)      // scores / probabilities
         + Arena::padded(r * d.Dvp * f)    // output accumulator
         + 2 * Arena::padded(r * f)        // running max, running sum
         + 2 * Arena::padded(r * w)        // keep-bits (two words when k_start % 64 != 0)
         + Arena::padded(kBc * f)          // bias row
         + Arena::padded(d.Dp * f);        // row conversion scratch
}

std::size_t backward_thread_tile_bytes(const Dims& d) {
  const std::size_t f = sizeof(float), w = sizeof(std::uint64_t);
  return Arena::padded(kBc * d.Dp * f)                    // K tile
         + Arena::padded(d.Dp * kBc * f)                  // Kᵀ tile
         + Arena::padded(d.Dvp * kBc * f)                 // Vᵀ tile
         + Arena::padded(kBc * d.Dp * f)                  // dK tile
         + Arena::padded(kBc * d.Dvp * f)                 // dV tile
         + Arena::padded(kBr * d.Dp * f)                  // Q tile
         + Arena::padded(kBr * d.Dvp * f)                 // dO tile
         + 3 * Arena::padded(kBr * kBc * f)               // S/P (then P∘Z), dP, dS
         + 2 * Arena::padded(kBr * f)                     // lse, D_i
         + 2 * Arena::padded(kBr * w)                     // keep-bits (two when unaligned)
         + Arena::padded(kBc * f)                         // bias row
         + Arena::padded(kBc * f)                         // softcap derivative of a row
         + Arena::padded(2 * std::max(d.Dp, d.Dvp) * f);  // row conversion scratch (two rows)
}

// Threads a pass starts: OpenMP's maximum, but no more than its parallel items (query blocks of
// every head forward, key blocks backward), so a small call neither wakes idle threads nor
// takes scratch for them.
int pass_threads(const Problem& pb, Pass pass) {
  const std::int64_t items = pass == Pass::forward ? pb.B * pb.Hq * ((pb.Lq + kBrFwd - 1) / kBrFwd)
                                                   : (pb.Lk + kBc - 1) / kBc;
  return static_cast<int>(std::clamp<std::int64_t>(items, 1, std::max(1, omp_get_max_threads())));
}

// Memory for a pass: the caller's workspace when given, else our own (freed on return).
class Scratch {
 public:
  Scratch(std::size_t need, const Options& options) {
    if (options.workspace) {
      if (options.workspace_bytes < need) {
        throw Error(ErrorCode::invalid_argument,
                    "workspace: the cpu backend needs " + std::to_string(need) +
                        " bytes (workspace_size), got " + std::to_string(options.workspace_bytes));
      }
      // Align the caller's pointer; workspace_bytes() includes the slack for it.
      auto addr = reinterpret_cast<std::uintptr_t>(options.workspace);
      base_ = reinterpret_cast<void*>((addr + kAlign - 1) / kAlign * kAlign);
    } else if (need > 0) {
      owned_.reset(static_cast<std::byte*>(::operator new (need, std::align_val_t{kAlign})));
      base_ = owned_.get();
    }
    bytes_ = need;
  }
  void* base() const { return base_; }
  std::size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { ::operator delete (p, std::align_val_t{kAlign}); }
  };
  std::unique_ptr<std::byte, Free> owned_;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
};

// Bias rows of (b, h, i), converted to fp32 when the bias is not fp32 already.
struct BiasReader {
  const TensorView* bias = nullptr;
  const float* row(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j0, std::int64_t n,
                   float* scratch) const {
    const TensorView& t = *bias;
    const std::int64_t off =
        t.offset(t.shape[0] == 1 ? 0 : b, t.shape[1] == 1 ? 0 : h, t.shape[2] == 1 ? 0 : i, j0);
    if (t.dtype == DType::f32) return static_cast<const float*>(t.data) + off;
    load_row(t, off, n, scratch);
    return scratch;
  }
};

// What both passes' tile loops read of one call besides the tensors and the tile sizes.
struct PassConstants {
  PassConstants(const Problem& pb, const AttentionArgs& args)
      : args(args),
        pb(pb),
        bias{args.bias ? &*args.bias : nullptr},
        scale(static_cast<float>(pb.scale)),
        G(pb.group_size()),
        dropout(pb.has_dropout()),
        key(dropout ? dropout_key(args.rng.seed, args.rng.offset) : DropoutKey{0, 0}),
        threshold(pb.dropout.threshold),
        keep_scale(static_cast<float>(pb.dropout.keep_scale)),
        softcap(static_cast<float>(pb.softcap)),
        row_scale(pb.has_softcap() ? 1.0f : scale) {}

  // Row i's keys within tile [j0, j0 + cols): columns [first, valid) (valid <= first: none).
  void tile_columns(std::int64_t i, std::int64_t j0, int cols, int& first, int& valid) const {
    const KeySpan keys = row_keys(pb, i);
    first = static_cast<int>(std::clamp<std::int64_t>(keys.begin - j0, 0, cols));
    valid = static_cast<int>(std::clamp<std::int64_t>(keys.end - j0, 0, cols));
  }

  // Softcap, ALiBi and the window's left edge for one tile row, in scalar code around the vector
  // row steps (which know a bias and a visible prefix only). With softcap the raw scores s[c]
  // become the capped c·tanh(scale·s / c) (the kernels then take scale 1: row_scale) and
  // cap_grad[c] their derivative 1 - tanh² (when cap_grad is given). Returns the row the kernels
  // add: `bias` itself where nothing additive changes, else `terms` (which may be `bias`) holding
  // bias - slope·|i + shift - j| and -inf before column `first`. Calls without window, ALiBi and
  // softcap never come here, so their results are those of the plain path bit for bit.
  const float* modify_row(float* s, const float* bias_row, std::int64_t b, std::int64_t h,
                          std::int64_t i, std::int64_t j0, int first, int valid, float* terms,
                          float* cap_grad) const {
    if (pb.has_softcap()) {
      for (int c = first; c < valid; ++c) {
        const float t = std::tanh(scale * s[c] / softcap);
        s[c] = softcap * t;
        if (cap_grad) cap_grad[c] = 1.0f - t * t;
      }
    }
    if (!pb.has_alibi && first == 0) return bias_row;
    const float slope = alibi_slope(pb, args, b, h);
    const std::int64_t distance0 = i + pb.position_shift() - j0;  // of column 0
    for (int c = 0; c < valid; ++c) {
      const float add = bias_row ? bias_row[c] : 0.0f;
      const std::int64_t dist = distance0 - c;
      terms[c] = c < first ? -kInf : add - slope * static_cast<float>(dist < 0 ? -dist : dist);
    }
    return terms;
  }

  // Keep-bits of `rows` query rows from global row `row0` for the 64 keys from global key `col0`:
  // bit c of keep[r] is key col0 + c. Key tiles start at multiples of 64 in the call, so they sit
  // on the dropout map's 64-column blocks unless the call's keys start off one (k_start % 64 !=
  // 0, a context-parallel chunk of uneven length): then the tile straddles two blocks, whose
  // words are drawn and spliced (`spare` holds the second).
  void keep_bits(std::uint64_t bh, std::uint64_t row0, int rows, std::uint64_t col0,
                 std::uint64_t* keep, std::uint64_t* spare) const {
    const unsigned shift = static_cast<unsigned>(col0 % kBc);
    kern.keep_masks64(key, bh, row0, rows, col0 / kBc, threshold, keep);
    if (shift == 0) return;
    kern.keep_masks64(key, bh, row0, rows, col0 / kBc + 1, threshold, spare);
    for (int r = 0; r < rows; ++r) keep[r] = (keep[r] >> shift) | (spare[r] << (kBc - shift));
  }

  const CpuKernels& kern = cpu_kernels();
  const AttentionArgs& args;
  const Problem& pb;
  BiasReader bias;
  float scale;     // of the scores
  std::int64_t G;  // query heads per kv head
  bool dropout;
  DropoutKey key;  // {0, 0} without dropout
  std::uint32_t threshold;
  float keep_scale;  // of kept values: 256 / threshold
  float softcap;     // 0: off
  float row_scale;   // the scale the row kernels apply: 1 where modify_row capped the scores
};

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  DeviceType device_type() const override { return DeviceType::cpu; }
  bool supports_global_coordinates() const override { return true; }

  std::vector<std::string> reasons_unsupported(const Problem& pb, Pass) const override {
    std::vector<std::string> why;
    if (pb.device.type != DeviceType::cpu) why.push_back("inputs are not on the CPU");
    if (pb.dtype == DType::f64) {
      why.push_back("fp64 inputs: the cpu backend computes in fp32 (the reference runs fp64)");
    }
    if (pb.D > kMaxHeadDim || pb.Dv > kMaxHeadDim) {
      why.push_back("head dim " + std::to_string(std::max(pb.D, pb.Dv)) + " > " +
                    std::to_string(kMaxHeadDim) + " (per-thread tiles would outgrow the caches)");
    }
    if (static_cast<std::uint64_t>(pb.q_start + pb.Lq) > kDropoutMaxRows && pb.has_dropout()) {
      why.push_back("Lq beyond the dropout map's row range");
    }
    return why;
  }

  std::size_t workspace_bytes(const Problem& pb, Pass pass) const override {
    if (pb.B == 0) return 0;  // every tensor is empty: nothing to do (sizes may be huge)
    const Dims d(pb);
    const auto threads = static_cast<std::size_t>(pass_threads(pb, pass));
    if (pass == Pass::forward) return kAlign + threads * forward_thread_bytes(d);
    return kAlign + threads * (backward_thread_tile_bytes(d) + dq_partial_bytes(pb, d)) +
           delta_bytes(pb) + dbias_shadow_bytes(pb);
  }

  void forward(const Problem& pb, const AttentionArgs& args, const TensorView& out,
               const TensorView& lse, const Options& options) override;
  void backward(const Problem& pb, const AttentionArgs& args, const BackwardTensors& g,
                const Options& options) override;

 private:
  static std::size_t dq_partial_bytes(const Problem& pb, const Dims& d) {
    return Arena::padded(static_cast<std::size_t>(pb.group_size() * pb.Lq * d.Dp) * sizeof(float));
  }
  // D_i = Σ_e dO·O of the query rows of one kv head (all heads of its group), shared.
  static std::size_t delta_bytes(const Problem& pb) {
    return Arena::padded(static_cast<std::size_t>(pb.group_size() * pb.Lq) * sizeof(float));
  }
  // An fp32 accumulator for dbias when dbias is not fp32 and receives several contributions per
  // element (broadcast bias); it has the bias's own shape.
  static bool needs_dbias_shadow(const Problem& pb) {
    return pb.has_bias && pb.bias_dtype != DType::f32 &&
           (pb.bias_bcast_b || pb.bias_bcast_h || pb.bias_bcast_q);
  }
  static std::size_t dbias_shadow_bytes(const Problem& pb) {
    if (!needs_dbias_shadow(pb)) return 0;
    const std::int64_t n = (pb.bias_bcast_b ? 1 : pb.B) * (pb.bias_bcast_h ? 1 : pb.Hq) *
                           (pb.bias_bcast_q ? 1 : pb.Lq) * pb.Lk;
    return Arena::padded(static_cast<std::size_t>(n) * sizeof(float));
  }
};

void CpuBackend::forward(const Problem& pb, const AttentionArgs& args, const TensorView& out,
                         const TensorView& lse, const Options& options) {
  if (pb.packed) return forward_per_sequence(*this, pb, args, out, lse, options);
  if (pb.B == 0) return;  // every tensor is empty
  const Dims d(pb);
  const std::size_t per_thread = forward_thread_bytes(d);
  Scratch scratch(workspace_bytes(pb, Pass::forward), options);
  const TensorView &q = args.q, &k = args.k, &v = args.v;
  const PassConstants pc(pb, args);
  const std::int64_t q_blocks = (pb.Lq + kBrFwd - 1) / kBrFwd;
  const std::int64_t items = pb.B * pb.Hq * q_blocks;
  float* lse_data = static_cast<float*>(lse.data);

#pragma omp parallel num_threads(pass_threads(pb, Pass::forward))
  {
    Arena arena(static_cast<std::byte*>(scratch.base()) + per_thread * omp_get_thread_num(),
                per_thread);
    float* qs = arena.floats(d.fwd_rows * d.Dp);
    float* kt = arena.floats(d.Dp * kBc);
    float* vs = arena.floats(kBc * d.Dvp);
    float* s = arena.floats(d.fwd_rows * kBc);
    float* o = arena.floats(d.fwd_rows * d.Dvp);
    float* m = arena.floats(d.fwd_rows);
    float* l = arena.floats(d.fwd_rows);
    std::uint64_t* keep = arena.words(d.fwd_rows);
    std::uint64_t* keep_spare = arena.words(d.fwd_rows);
    float* brow = arena.floats(kBc);
    float* conv = arena.floats(d.Dp);
    std::fill(vs, vs + kBc * d.Dvp, 0.0f);  // padding columns stay zero

#pragma omp for schedule(dynamic, 1)
    for (std::int64_t item = 0; item < items; ++item) {
      const std::int64_t qb = item % q_blocks, bh = item / q_blocks;
      const std::int64_t b = bh / pb.Hq, h = bh % pb.Hq, kvh = h / pc.G;
      const std::int64_t i0 = qb * kBrFwd;
      const int rows = static_cast<int>(std::min<std::int64_t>(kBrFwd, pb.Lq - i0));
      for (int r = 0; r < rows; ++r) load_row(q, q.offset(b, h, i0 + r, 0), d.D, qs + r * d.Dp);
      std::fill(o, o + rows * d.Dvp, 0.0f);
      std::fill(m, m + rows, -kInf);
      std::fill(l, l + rows, 0.0f);
      // Keys before the first row's window and past the last row's horizon are skipped (spans
      // move right with the row), whole tiles at a time: tiles stay on the 64-key grid.
      const std::int64_t key_begin = row_keys(pb, i0).begin / kBc * kBc;
      const std::int64_t key_end = row_keys(pb, i0 + rows - 1).end;
      for (std::int64_t j0 = key_begin; j0 < key_end; j0 += kBc) {
        const int cols = static_cast<int>(std::min<std::int64_t>(kBc, pb.Lk - j0));
        for (int c = 0; c < cols; ++c) {
          const float* krow = conv;
          if (k.dtype == DType::f32) {
            krow = static_cast<const float*>(k.data) + k.offset(b, kvh, j0 + c, 0);
          } else {
            load_row(k, k.offset(b, kvh, j0 + c, 0), d.D, conv);
          }
          for (std::int64_t e = 0; e < d.D; ++e) kt[e * kBc + c] = krow[e];
          load_row(v, v.offset(b, kvh, j0 + c, 0), d.Dv, vs + c * d.Dvp);
        }
        if (cols < kBc) {
          for (std::int64_t e = 0; e < d.D; ++e)
            std::fill(kt + e * kBc + cols, kt + (e + 1) * kBc, 0.0f);
        }
        pc.kern.gemm(rows, kBc, static_cast<int>(d.D), qs, static_cast<int>(d.Dp), kt, kBc, s, kBc,
                     false);
        if (pc.dropout) {
          pc.keep_bits(static_cast<std::uint64_t>(bh + pb.rng_batch0 * pb.Hq),
                       static_cast<std::uint64_t>(pb.q_start + i0), rows,
                       static_cast<std::uint64_t>(pb.k_start + j0), keep, keep_spare);
        }
        for (int r = 0; r < rows; ++r) {
          float* srow = s + r * kBc;
          const std::int64_t i = i0 + r;
          int first = 0, valid = 0;
          pc.tile_columns(i, j0, cols, first, valid);
          if (valid <= first) {
            std::fill(srow, srow + kBc, 0.0f);
            continue;
          }
          const float* bias_row = pc.bias.bias ? pc.bias.row(b, h, i, j0, valid, brow) : nullptr;
          float row_scale = pc.scale;
          if (pb.has_score_modifiers()) {
            bias_row = pc.modify_row(srow, bias_row, b, h, i, j0, first, valid, brow, nullptr);
            row_scale = pc.row_scale;
          }
          pc.kern.online_softmax64(srow, row_scale, bias_row, valid, &m[r], &l[r], o + r * d.Dvp,
                                   static_cast<int>(d.Dvp));
          if (pc.dropout) pc.kern.apply_keep64(srow, keep[r], 1.0f);
        }
        pc.kern.gemm(rows, static_cast<int>(d.Dvp), cols, s, kBc, vs, static_cast<int>(d.Dvp), o,
                     static_cast<int>(d.Dvp), true);
      }
      for (int r = 0; r < rows; ++r) {
        const std::int64_t i = i0 + r;
        const bool empty = l[r] == 0.0f;
        const float factor = empty ? 0.0f : pc.keep_scale / l[r];
        if (empty) std::fill(o + r * d.Dvp, o + (r + 1) * d.Dvp, 0.0f);
        store_row(out, out.offset(b, h, i, 0), d.Dv, o + r * d.Dvp, factor);
        lse_data[lse.offset(b, h, i)] = empty ? -kInf : m[r] + std::log(l[r]);
      }
    }
  }
}

void CpuBackend::backward(const Problem& pb, const AttentionArgs& args, const BackwardTensors& g,
                          const Options& options) {
  if (pb.packed) return backward_per_sequence(*this, pb, args, g, options);
  if (pb.B == 0) {  // every tensor is empty but a bias broadcast over B: its gradient is 0
    if (g.dbias) zero_view(*g.dbias);
    return;
  }
  const Dims d(pb);
  const std::size_t tile_bytes = backward_thread_tile_bytes(d);
  const std::size_t part_bytes = dq_partial_bytes(pb, d);
  const int threads = pass_threads(pb, Pass::backward);
  Scratch scratch(workspace_bytes(pb, Pass::backward), options);
  const TensorView &q = args.q, &k = args.k, &v = args.v;
  const PassConstants pc(pb, args);
  const std::int64_t k_blocks = (pb.Lk + kBc - 1) / kBc;
  const float* lse_data = static_cast<const float*>(g.lse.data);

  std::byte* base = static_cast<std::byte*>(scratch.base());
  std::byte* parts_base = base + static_cast<std::size_t>(threads) * tile_bytes;
  // Every partial starts at zero (also those of threads the runtime may not start).
  std::memset(parts_base, 0, static_cast<std::size_t>(threads) * part_bytes);
  float* delta =
      reinterpret_cast<float*>(parts_base + static_cast<std::size_t>(threads) * part_bytes);

  // dbias accumulates in fp32: in dbias itself when it is fp32, in a shadow when it is 16-bit and
  // broadcast, and is written directly (one contribution per element) otherwise.
  // An empty dbias (Lk = 0, and then possibly a null pointer) has nothing to write.
  const TensorView* dbias = g.dbias && g.dbias->numel() > 0 ? &*g.dbias : nullptr;
  float* shadow = nullptr;
  std::int64_t sh_stride[4] = {0, 0, 0, 0};
  if (dbias) {
    const TensorView& db = *dbias;
    if (db.dtype == DType::f32) {
      for (std::int64_t b = 0; b < db.shape[0]; ++b)
        for (std::int64_t h = 0; h < db.shape[1]; ++h)
          for (std::int64_t i = 0; i < db.shape[2]; ++i)
            std::fill_n(static_cast<float*>(db.data) + db.offset(b, h, i, 0), db.shape[3], 0.0f);
    } else if (needs_dbias_shadow(pb)) {
      shadow = reinterpret_cast<float*>(
          parts_base + static_cast<std::size_t>(threads) * part_bytes + delta_bytes(pb));
      sh_stride[3] = 1;
      sh_stride[2] = db.shape[3];
      sh_stride[1] = db.shape[2] * sh_stride[2];
      sh_stride[0] = db.shape[1] * sh_stride[1];
      std::fill_n(shadow, db.numel(), 0.0f);
    } else {
      zero_view(db);  // rows no query block reaches (causal) still need zeros
    }
  }

  // The key-block loop's schedule (schedule(runtime) below), the caller's restored after.
  omp_sched_t caller_kind;
  int caller_chunk = 0;
  omp_get_schedule(&caller_kind, &caller_chunk);
  omp_set_schedule(options.deterministic ? omp_sched_static : omp_sched_dynamic, 1);
#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num();
    Arena arena(base + tile_bytes * static_cast<std::size_t>(tid), tile_bytes);
    float* kj = arena.floats(kBc * d.Dp);
    float* kjt = arena.floats(d.Dp * kBc);
    float* vjt = arena.floats(d.Dvp * kBc);
    float* dk = arena.floats(kBc * d.Dp);
    float* dv = arena.floats(kBc * d.Dvp);
    float* qi = arena.floats(kBr * d.Dp);
    float* doi = arena.floats(kBr * d.Dvp);
    float* s = arena.floats(kBr * kBc);
    float* dp = arena.floats(kBr * kBc);
    float* ds = arena.floats(kBr * kBc);
    float* lse_r = arena.floats(kBr);
    float* di = arena.floats(kBr);
    std::uint64_t* keep = arena.words(kBr);
    std::uint64_t* keep_spare = arena.words(kBr);
    float* brow = arena.floats(kBc);
    float* cap_grad = arena.floats(kBc);
    float* conv = arena.floats(2 * std::max(d.Dp, d.Dvp));
    float* part = reinterpret_cast<float*>(parts_base + part_bytes * static_cast<std::size_t>(tid));
    std::fill(kj, kj + kBc * d.Dp, 0.0f);
    std::fill(qi, qi + kBr * d.Dp, 0.0f);
    std::fill(doi, doi + kBr * d.Dvp, 0.0f);

    for (std::int64_t bk = 0; bk < pb.B * pb.Hkv; ++bk) {
      const std::int64_t b = bk / pb.Hkv, kvh = bk % pb.Hkv;
      // D_i of every query row of this kv head's group, once (not once per key block).
#pragma omp for schedule(static)
      for (std::int64_t row = 0; row < pc.G * pb.Lq; ++row) {
        const std::int64_t h = kvh * pc.G + row / pb.Lq, i = row % pb.Lq;
        float* o_row = conv;
        float* do_row = conv + d.Dvp;
        load_row(g.out, g.out.offset(b, h, i, 0), d.Dv, o_row);
        load_row(g.dout, g.dout.offset(b, h, i, 0), d.Dv, do_row);
        double acc = 0.0;
        for (std::int64_t e = 0; e < d.Dv; ++e) acc += static_cast<double>(do_row[e]) * o_row[e];
        delta[row] = static_cast<float>(acc);
      }  // implicit barrier: delta is complete

      // Key blocks go to whichever thread is free, or with Options::deterministic round-robin
      // (the schedule set above the region): each thread's dQ partial then holds the same blocks
      // on every call, so dq is bitwise repeatable for a given thread count.
#pragma omp for schedule(runtime)
      for (std::int64_t jb = 0; jb < k_blocks; ++jb) {
        const std::int64_t j0 = jb * kBc;
        const int cols = static_cast<int>(std::min<std::int64_t>(kBc, pb.Lk - j0));
        std::fill(kjt, kjt + d.Dp * kBc, 0.0f);
        std::fill(vjt, vjt + d.Dvp * kBc, 0.0f);
        for (int c = 0; c < cols; ++c) {
          float* krow = kj + c * d.Dp;
          load_row(k, k.offset(b, kvh, j0 + c, 0), d.D, krow);
          for (std::int64_t e = 0; e < d.D; ++e) kjt[e * kBc + c] = krow[e];
          load_row(v, v.offset(b, kvh, j0 + c, 0), d.Dv, conv);
          for (std::int64_t e = 0; e < d.Dv; ++e) vjt[e * kBc + c] = conv[e];
        }
        for (int c = cols; c < kBc; ++c) std::fill(kj + c * d.Dp, kj + (c + 1) * d.Dp, 0.0f);
        std::fill(dk, dk + kBc * d.Dp, 0.0f);
        std::fill(dv, dv + kBc * d.Dvp, 0.0f);

        for (std::int64_t hg = 0; hg < pc.G; ++hg) {
          const std::int64_t h = kvh * pc.G + hg;
          const std::int64_t bh = (pb.rng_batch0 + b) * pb.Hq + h;  // the dropout map's head
          // The query rows that see a key of this tile (causal mask and window).
          const KeySpan seen_by = rows_seeing(pb, j0, j0 + cols);
          for (std::int64_t i0 = seen_by.begin; i0 < seen_by.end; i0 += kBr) {
            const int rows = static_cast<int>(std::min<std::int64_t>(kBr, seen_by.end - i0));
            for (int r = 0; r < rows; ++r) {
              const std::int64_t i = i0 + r;
              load_row(q, q.offset(b, h, i, 0), d.D, qi + r * d.Dp);
              load_row(g.dout, g.dout.offset(b, h, i, 0), d.Dv, doi + r * d.Dvp);
              di[r] = delta[hg * pb.Lq + i];
              const float l = lse_data[g.lse.offset(b, h, i)];
              lse_r[r] = l == -kInf ? kInf : l;  // empty row: every P becomes exp(-inf) = 0
            }
            pc.kern.gemm(rows, kBc, static_cast<int>(d.D), qi, static_cast<int>(d.Dp), kjt, kBc, s,
                         kBc, false);
            pc.kern.gemm(rows, kBc, static_cast<int>(d.Dv), doi, static_cast<int>(d.Dvp), vjt, kBc,
                         dp, kBc, false);
            if (pc.dropout) {
              pc.keep_bits(static_cast<std::uint64_t>(bh),
                           static_cast<std::uint64_t>(pb.q_start + i0), rows,
                           static_cast<std::uint64_t>(pb.k_start + j0), keep, keep_spare);
            }
            for (int r = 0; r < rows; ++r) {
              const std::int64_t i = i0 + r;
              float* prow = s + r * kBc;
              float* dprow = dp + r * kBc;
              float* dsrow = ds + r * kBc;
              int first = 0, valid = 0;
              pc.tile_columns(i, j0, cols, first, valid);
              if (valid <= first) {
                std::fill(prow, prow + kBc, 0.0f);
                std::fill(dsrow, dsrow + kBc, 0.0f);
                continue;
              }
              const float* bias_row =
                  pc.bias.bias ? pc.bias.row(b, h, i, j0, valid, brow) : nullptr;
              float row_scale = pc.scale;
              if (pb.has_score_modifiers()) {
                bias_row = pc.modify_row(prow, bias_row, b, h, i, j0, first, valid, brow, cap_grad);
                row_scale = pc.row_scale;
              }
              // P = exp(S·scale + bias − lse), dS = P∘(Z∘dP − D_i); prow becomes P∘Z for dV.
              pc.kern.softmax_grad64(prow, dprow, dsrow, row_scale, bias_row, valid, lse_r[r],
                                     di[r], pc.dropout ? keep[r] : 0, pc.keep_scale, pc.dropout);
              // dS is exactly 0 for a row that sees one key (core/visible_keys.h); not in a key
              // block of a larger attention, where the row may see keys of other blocks too.
              // A NaN or Inf stays: it is the data's, not rounding's (docs/api.md); x·0 is 0 for
              // finite x and NaN otherwise, as in the sm90 backward.
              if (!pb.kv_block && row_keys(pb, i).size() == 1) {
                for (int c = 0; c < kBc; ++c) dsrow[c] *= 0.0f;
              }
              if (dbias) {
                const TensorView& db = *dbias;
                const std::int64_t bb = db.shape[0] == 1 ? 0 : b, hh = db.shape[1] == 1 ? 0 : h,
                                   ii = db.shape[2] == 1 ? 0 : i;
                if (db.dtype == DType::f32) {
                  float* dbrow = static_cast<float*>(db.data) + db.offset(bb, hh, ii, j0);
                  for (int c = 0; c < cols; ++c) dbrow[c] += dsrow[c];
                } else if (shadow) {
                  float* dbrow =
                      shadow + bb * sh_stride[0] + hh * sh_stride[1] + ii * sh_stride[2] + j0;
                  for (int c = 0; c < cols; ++c) dbrow[c] += dsrow[c];
                } else {
                  store_row(db, db.offset(bb, hh, ii, j0), cols, dsrow, 1.0f);
                }
              }
              // dbias took the gradient of the capped score; q and k get it through the cap.
              if (pb.has_softcap()) {
                for (int c = first; c < valid; ++c) dsrow[c] *= cap_grad[c];
              }
            }
            // dV += (P∘Z)ᵀ·dO and dK += dSᵀ·Q, reading the row-major tiles as transposed factors.
            pc.kern.gemm_at(cols, static_cast<int>(d.Dvp), rows, s, kBc, doi,
                            static_cast<int>(d.Dvp), dv, static_cast<int>(d.Dvp), true);
            pc.kern.gemm_at(cols, static_cast<int>(d.Dp), rows, ds, kBc, qi, static_cast<int>(d.Dp),
                            dk, static_cast<int>(d.Dp), true);
            pc.kern.gemm(rows, static_cast<int>(d.Dp), cols, ds, kBc, kj, static_cast<int>(d.Dp),
                         part + (hg * pb.Lq + i0) * d.Dp, static_cast<int>(d.Dp), true);
          }
        }
        for (int c = 0; c < cols; ++c) {
          store_row(g.dk, g.dk.offset(b, kvh, j0 + c, 0), d.D, dk + c * d.Dp, pc.scale);
          store_row(g.dv, g.dv.offset(b, kvh, j0 + c, 0), d.Dv, dv + c * d.Dvp, 1.0f);
        }
      }  // implicit barrier: every partial of this kv head is complete
      const std::int64_t dq_rows = pc.G * pb.Lq;
#pragma omp for schedule(static)
      for (std::int64_t row = 0; row < dq_rows; ++row) {
        const std::int64_t hg = row / pb.Lq, i = row % pb.Lq, h = kvh * pc.G + hg;
        float* sum = conv;  // per-thread scratch
        std::fill(sum, sum + d.D, 0.0f);
        for (int t = 0; t < threads; ++t) {
          float* pt =
              reinterpret_cast<float*>(parts_base + part_bytes * static_cast<std::size_t>(t)) +
              row * d.Dp;
          for (std::int64_t e = 0; e < d.D; ++e) sum[e] += pt[e];
          std::fill(pt, pt + d.D, 0.0f);
        }
        store_row(g.dq, g.dq.offset(b, h, i, 0), d.D, sum, pc.scale);
      }  // implicit barrier before the next kv head reuses the partials
    }
  }
  omp_set_schedule(caller_kind, caller_chunk);

  if (shadow) {
    const TensorView& db = *dbias;
    for (std::int64_t b = 0; b < db.shape[0]; ++b)
      for (std::int64_t h = 0; h < db.shape[1]; ++h)
        for (std::int64_t i = 0; i < db.shape[2]; ++i) {
          const float* src = shadow + b * sh_stride[0] + h * sh_stride[1] + i * sh_stride[2];
          store_row(db, db.offset(b, h, i, 0), db.shape[3], src, 1.0f);
        }
  }
}

}  // namespace

std::shared_ptr<Backend> make_cpu_backend() { return std::make_shared<CpuBackend>(); }

}  // namespace memeff::detail

namespace memeff {

const char* cpu_kernel_isa() { return detail::cpu_kernels().name; }

}  // namespace memeff
