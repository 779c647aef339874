// Drawing, describing and materializing one soak call (soak_call.h).
#include "soak_call.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "memeff/backend.h"
#include "memeff/error.h"

namespace memeff::soak {

namespace {

std::int64_t round8(std::int64_t n) { return (n + 7) / 8 * 8; }

std::int64_t numel(const std::vector<std::int64_t>& dims) {
  std::int64_t n = 1;
  for (std::int64_t d : dims) n *= d;
  return n;
}

std::int64_t sum(const std::vector<std::int64_t>& v) {
  std::int64_t s = 0;
  for (std::int64_t x : v) s += x;
  return s;
}

std::int64_t uniform(std::mt19937_64& gen, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(gen);
}

bool chance(std::mt19937_64& gen, double p) { return std::bernoulli_distribution(p)(gen); }

// A length in [1, max_len]: a third from the lengths that straddle tile and vector sizes, the
// rest log-uniform, so short calls are common and long ones still come.
std::int64_t draw_length(std::mt19937_64& gen, std::int64_t max_len) {
  static constexpr std::int64_t kAwkward[] = {1,   2,   3,   15,  16,  17,   31,   63,  64,
                                              65,  96,  127, 128, 129, 191,  255,  256, 257,
                                              383, 511, 512, 513, 767, 1013, 1023, 1024};
  if (chance(gen, 1.0 / 3)) {
    std::vector<std::int64_t> fit;
    for (std::int64_t l : kAwkward) {
      if (l <= max_len) fit.push_back(l);
    }
    return fit[static_cast<std::size_t>(
        uniform(gen, 0, static_cast<std::int64_t>(fit.size()) - 1))];
  }
  const double x = std::uniform_real_distribution<double>(0.0, std::log(max_len + 1.0))(gen);
  return std::clamp<std::int64_t>(static_cast<std::int64_t>(std::exp(x)), 1, max_len);
}

// A head dim in [1, max]: half the time one of the main buckets (64, 128, 256), else a multiple
// of 8 (what the fused kernels take, zero-padded to a bucket), sometimes any size (the CPU
// backends take it; the fused ones refuse it, which is a redraw).
std::int64_t draw_head_dim(std::mt19937_64& gen, std::int64_t max, bool on_cuda) {
  const double r = std::uniform_real_distribution<double>(0.0, 1.0)(gen);
  if (r < 0.5) {
    std::vector<std::int64_t> fit;
    for (std::int64_t d : {64, 128, 256}) {
      if (d <= max) fit.push_back(d);
    }
    if (!fit.empty()) {
      return fit[static_cast<std::size_t>(
          uniform(gen, 0, static_cast<std::int64_t>(fit.size()) - 1))];
    }
  }
  if (max >= 8 && r < (on_cuda ? 0.95 : 0.75)) return 8 * uniform(gen, 1, max / 8);
  return uniform(gen, 1, max);
}

// Whether every tensor of the call holds at most `max` elements.
bool fits(const CallSpec& s, std::int64_t max) {
  const std::int64_t rows_q = s.total_q(), rows_k = s.total_k();
  const std::int64_t widest = std::max(s.D, s.Dv);
  return rows_q * s.Hq * widest <= max && rows_k * s.Hkv * widest <= max &&
         (!s.has_bias() || numel(s.bias_shape()) <= max);
}

// Shrinks a call until it fits the element budget: the bias broadcasts first (heads, batch,
// rows), then fewer batches or sequences, kv heads, a smaller group, then shorter lengths.
void shrink_to_fit(CallSpec& s, std::int64_t max) {
  while (!fits(s, max)) {
    if (s.has_bias() && numel(s.bias_shape()) > max) {
      const std::size_t at = s.bias[1] != '1' ? 1 : s.bias[0] != '1' ? 0 : 2;
      if (s.bias[at] != '1') {
        s.bias[at] = '1';
        continue;
      }
    }
    if (s.B > 1) {
      --s.B;
      if (s.packed) {
        s.seqlens_q.pop_back();
        s.seqlens_k.pop_back();
      }
    } else if (s.Hkv > 1) {
      s.Hq -= s.group();
      --s.Hkv;
    } else if (s.Hq > 1) {
      s.Hq /= 2;
      s.Hkv = 1;
    } else {
      for (auto* lens : {&s.seqlens_q, &s.seqlens_k}) {
        for (std::int64_t& l : *lens) l /= 2;
      }
      s.Lq = std::max<std::int64_t>(s.Lq / 2, s.packed ? 0 : 1);
      s.Lk = std::max<std::int64_t>(s.Lk / 2, s.packed ? 0 : 1);
    }
  }
  if (s.packed) {
    s.Lq = s.seqlens_q.empty() ? 0 : *std::max_element(s.seqlens_q.begin(), s.seqlens_q.end());
    s.Lk = s.seqlens_k.empty() ? 0 : *std::max_element(s.seqlens_k.begin(), s.seqlens_k.end());
  }
}

std::string lengths_text(const std::vector<std::int64_t>& lens) {
  std::string s;
  for (std::size_t i = 0; i < lens.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(lens[i]);
  }
  return s;
}

const unsigned char* advance(const void* base, DType dtype, std::int64_t elements) {
  return static_cast<const unsigned char*>(base) +
         static_cast<std::size_t>(elements) * dtype_size(dtype);
}

// An output of `dims` on `device`, poisoned with NaN (every byte 0xFF).
Output make_output(Device device, DType dtype, const std::vector<std::int64_t>& dims,
                   bool blhd = false) {
  Output o;
  o.buffer = cli::Buffer(device, static_cast<std::size_t>(numel(dims)) * dtype_size(dtype));
  o.buffer.fill_bytes(0xFF);
  o.view = view_of(o.buffer.data(), dtype, device, dims, blhd);
  return o;
}

}  // namespace

// A view of `dims` over `data`: contiguous, or [B, L, H, X] storage of a logical [B, H, L, X].
TensorView view_of(const void* data, DType dtype, Device device,
                   const std::vector<std::int64_t>& dims, bool blhd) {
  TensorView v;
  v.data = const_cast<void*>(data);
  v.dtype = dtype;
  v.device = device;
  v.rank = static_cast<int>(dims.size());
  std::int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.shape[d] = dims[d];
    v.stride[d] = stride;
    stride *= std::max<std::int64_t>(dims[d], 1);
  }
  if (blhd && v.rank == 4) {
    const std::int64_t H = std::max<std::int64_t>(dims[1], 1),
                       L = std::max<std::int64_t>(dims[2], 1),
                       X = std::max<std::int64_t>(dims[3], 1);
    v.stride = {L * H * X, X, H * X, 1};
  }
  return v;
}

std::vector<std::int64_t> shape_of(const TensorView& v) {
  return {v.shape.begin(), v.shape.begin() + v.rank};
}

std::int64_t CallSpec::total_q() const { return packed ? sum(seqlens_q) : B * Lq; }
std::int64_t CallSpec::total_k() const { return packed ? sum(seqlens_k) : B * Lk; }

std::vector<std::int64_t> CallSpec::bias_shape() const {
  const std::int64_t full[4] = {B, Hq, Lq, Lk};
  std::vector<std::int64_t> shape(4);
  for (int d = 0; d < 4; ++d) shape[d] = bias[static_cast<std::size_t>(d)] == '1' ? 1 : full[d];
  return shape;
}

std::int64_t CallSpec::pool_elements() const {
  const std::int64_t q = total_q() * Hq, k = total_k() * Hkv;
  return round8(q * D) + round8(k * D) + round8(k * Dv) + round8(q * Dv) +
         (has_bias() ? round8(numel(bias_shape())) : 0);
}

std::string CallSpec::describe() const {
  std::ostringstream os;
  os << "call " << index << ": " << backend << " " << dtype_name(dtype) << " "
     << (backward ? "fwd+bwd" : "fwd");
  if (packed) {
    os << " packed S=" << B << " seqlens_q=" << lengths_text(seqlens_q)
       << " seqlens_k=" << lengths_text(seqlens_k);
  } else {
    os << " B=" << B << " Lq=" << Lq << " Lk=" << Lk;
  }
  os << " Hq=" << Hq << " Hkv=" << Hkv << " D=" << D << " Dv=" << Dv
     << " causal=" << causal_mode_name(causal) << " dropout=" << dropout << " rng_seed=" << rng_seed
     << " rng_offset=" << rng_offset << " bias=" << bias;
  if (has_bias()) os << "/" << dtype_name(bias_dtype);
  os << " layout="
     << (packed ? "packed"
         : blhd ? "blhd"
                : "bhld")
     << " scale=" << (scale ? std::to_string(*scale) : std::string("default"))
     << " deterministic=" << deterministic
     << " workspace=" << (caller_workspace ? "caller" : "library") << " pool_start=" << pool_start
     << (misaligned ? " (misaligned)" : "");
  return os.str();
}

std::mt19937_64 call_generator(std::uint64_t seed, std::uint64_t index) {
  std::seed_seq seq{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                    static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32)};
  return std::mt19937_64(seq);
}

CallSpec draw_call(const std::vector<std::string>& backends, const Limits& limits,
                   std::int64_t pool_size, std::uint64_t index, std::mt19937_64& gen) {
  CallSpec s;
  s.index = index;
  s.backend = backends[static_cast<std::size_t>(
      uniform(gen, 0, static_cast<std::int64_t>(backends.size()) - 1))];
  const std::shared_ptr<Backend> backend = find_backend(s.backend);
  const bool on_cuda = backend && backend->device_type() == DeviceType::cuda;
  s.device = on_cuda ? Device::cuda(0) : Device::cpu();
  // fp16 and bf16 everywhere; fp32 on the CPU (and now and then on a GPU, where only cuda_math
  // takes it: a redraw for the fused backends).
  const double t = std::uniform_real_distribution<double>(0.0, 1.0)(gen);
  s.dtype = t < (on_cuda ? 0.1 : 1.0 / 3)    ? DType::f32
            : t < (on_cuda ? 0.55 : 2.0 / 3) ? DType::f16
                                             : DType::bf16;
  s.backward = chance(gen, 0.7);
  s.packed = chance(gen, 0.2);
  static constexpr std::int64_t kGroups[] = {1, 2, 4, 8};
  s.Hkv = uniform(gen, 1, limits.max_kv_heads);
  s.Hq = s.Hkv * kGroups[uniform(gen, 0, 3)];
  s.D = draw_head_dim(gen, limits.max_head_dim, on_cuda);
  s.Dv = chance(gen, 0.75) ? s.D : draw_head_dim(gen, limits.max_head_dim, on_cuda);
  s.causal = static_cast<CausalMode>(uniform(gen, 0, 2));
  if (chance(gen, 0.5)) s.dropout = std::uniform_real_distribution<double>(0.1, 0.3)(gen);
  s.rng_seed = gen();
  s.rng_offset = chance(gen, 0.5) ? gen() % 4096 : gen() >> 24;
  if (s.packed) {
    s.B = uniform(gen, 1, limits.max_batch + 2);
    for (std::int64_t i = 0; i < s.B; ++i) {
      const std::int64_t lq = chance(gen, 0.08) ? 0 : draw_length(gen, limits.max_len);
      s.seqlens_q.push_back(lq);
      s.seqlens_k.push_back(chance(gen, 0.15)   ? lq
                            : chance(gen, 0.08) ? 0
                                                : draw_length(gen, limits.max_len));
    }
  } else {
    s.B = uniform(gen, 1, limits.max_batch);
    s.Lq = draw_length(gen, limits.max_len);
    s.Lk = chance(gen, 0.15) ? s.Lq : draw_length(gen, limits.max_len);
    if (chance(gen, 0.3)) {
      s.bias = "bhqk";
      for (std::size_t d = 0; d < 3; ++d) {
        if (chance(gen, 0.35)) s.bias[d] = '1';
      }
      s.bias_dtype = chance(gen, 0.5) ? DType::f32 : s.dtype;
    }
    s.blhd = chance(gen, 0.3);
  }
  if (chance(gen, 0.15)) s.scale = std::uniform_real_distribution<double>(0.03, 0.3)(gen);
  s.deterministic = chance(gen, 0.15);
  s.caller_workspace = chance(gen, 0.5);
  s.misaligned = chance(gen, 0.04);
  shrink_to_fit(s, limits.max_elements);
  // q starts on a multiple of 8 elements (16 bytes for fp16), plus one when misaligned.
  const std::int64_t room = pool_size - s.pool_elements() - 1;
  if (room < 0)
    throw Error(ErrorCode::internal, "soak: the input pool is too small for " + s.describe());
  s.pool_start = uniform(gen, 0, room) / 8 * 8 + (s.misaligned ? 1 : 0);
  return s;
}

InputPools::InputPools(std::uint64_t seed, std::int64_t elements) : elements_(elements) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    host_[dtype].resize(static_cast<std::size_t>(elements) * dtype_size(dtype));
  }
  std::mt19937_64 gen(seed ^ 0x5eed5eed5eed5eedull);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (std::int64_t i = 0; i < elements; ++i) {
    const double v = normal(gen);
    for (auto& [dtype, bytes] : host_) store_element(bytes.data(), dtype, i, v);
  }
}

void InputPools::prepare(DType dtype, Device device) {
  if (device.type != DeviceType::cuda || device_.count({dtype, device.index})) return;
  const std::vector<unsigned char>& values = host_.at(dtype);
  cli::Buffer b(device, values.size());
  b.upload(values.data(), values.size());
  device_.emplace(std::pair{dtype, device.index}, std::move(b));
}

const void* InputPools::host(DType dtype) const {
  const auto it = host_.find(dtype);
  if (it == host_.end())
    throw Error(ErrorCode::internal, "soak: no input pool prepared for this dtype");
  return it->second.data();
}

const void* InputPools::on(DType dtype, Device device) const {
  if (device.type == DeviceType::cpu) return host(dtype);
  const auto it = device_.find({dtype, device.index});
  if (it == device_.end())
    throw Error(ErrorCode::internal, "soak: no device pool prepared for this dtype");
  return it->second.data();
}

CallTensors::CallTensors(const CallSpec& s, const InputPools& pools) {
  const std::int64_t Tq = s.total_q(), Tk = s.total_k();
  auto dims = [&](std::int64_t heads, bool query, std::int64_t width) {
    return s.packed ? std::vector<std::int64_t>{query ? Tq : Tk, heads, width}
                    : std::vector<std::int64_t>{s.B, heads, query ? s.Lq : s.Lk, width};
  };
  const auto q_dims = dims(s.Hq, true, s.D), k_dims = dims(s.Hkv, false, s.D),
             v_dims = dims(s.Hkv, false, s.Dv), o_dims = dims(s.Hq, true, s.Dv);
  const std::vector<std::int64_t> bias_dims = s.bias_shape();
  // Inputs: consecutive regions of the pool from pool_start, each rounded up to 8 elements.
  auto inputs = [&](bool host, AttentionArgs& a, TensorView& dout_view) {
    const Device device = host ? Device::cpu() : s.device;
    auto base = [&](DType dtype) { return host ? pools.host(dtype) : pools.on(dtype, device); };
    std::int64_t at = s.pool_start;
    auto next = [&](DType dtype, const std::vector<std::int64_t>& d, bool blhd) {
      const TensorView v = view_of(advance(base(dtype), dtype, at), dtype, device, d, blhd);
      at += round8(numel(d));
      return v;
    };
    a.q = next(s.dtype, q_dims, s.blhd);
    a.k = next(s.dtype, k_dims, s.blhd);
    a.v = next(s.dtype, v_dims, s.blhd);
    dout_view = next(s.dtype, o_dims, s.blhd);
    if (s.has_bias()) a.bias = next(s.bias_dtype, bias_dims, false);
    a.scale = s.scale;
    a.causal = s.causal;
    a.dropout_p = s.dropout;
    a.rng = {s.rng_seed, s.rng_offset};
  };
  inputs(false, args, dout);
  inputs(true, host_args, host_dout);
  if (s.packed) {
    auto offsets = [](const std::vector<std::int64_t>& lens) {
      std::vector<std::int32_t> cu(lens.size() + 1, 0);
      for (std::size_t i = 0; i < lens.size(); ++i) {
        cu[i + 1] = cu[i] + static_cast<std::int32_t>(lens[i]);
      }
      return cu;
    };
    cu_q_host = offsets(s.seqlens_q);
    cu_k_host = offsets(s.seqlens_k);
    const std::size_t bytes = cu_q_host.size() * sizeof(std::int32_t);
    cu_q = cli::Buffer(s.device, bytes);
    cu_k = cli::Buffer(s.device, bytes);
    cu_q.upload(cu_q_host.data(), bytes);
    cu_k.upload(cu_k_host.data(), bytes);
    auto packed = [&](const void* q_offsets, const void* k_offsets, Device device) {
      const std::vector<std::int64_t> n{static_cast<std::int64_t>(cu_q_host.size())};
      PackedSequences p;
      p.cu_seqlens_q = view_of(q_offsets, DType::i32, device, n);
      p.cu_seqlens_k = view_of(k_offsets, DType::i32, device, n);
      p.max_seqlen_q = s.Lq;
      p.max_seqlen_k = s.Lk;
      return p;
    };
    args.packed = packed(cu_q.data(), cu_k.data(), s.device);
    host_args.packed = packed(cu_q_host.data(), cu_k_host.data(), Device::cpu());
  }
}

void CallTensors::allocate_outputs(const CallSpec& s) {
  const std::vector<std::int64_t> q_dims = shape_of(args.q), k_dims = shape_of(args.k),
                                  v_dims = shape_of(args.v), o_dims = shape_of(dout);
  out = make_output(s.device, s.dtype, o_dims, s.blhd);
  lse = make_output(s.device, DType::f32,
                    s.packed ? std::vector<std::int64_t>{s.Hq, s.total_q()}
                             : std::vector<std::int64_t>{s.B, s.Hq, s.Lq});
  if (!s.backward) return;
  dq = make_output(s.device, s.dtype, q_dims, s.blhd);
  dk = make_output(s.device, s.dtype, k_dims, s.blhd);
  dv = make_output(s.device, s.dtype, v_dims, s.blhd);
  if (s.has_bias()) dbias = make_output(s.device, s.bias_dtype, s.bias_shape());
}

BackwardTensors CallTensors::grads() const {
  BackwardTensors g{dout, out.view, lse.view, dq.view, dk.view, dv.view, std::nullopt};
  if (dbias.view.defined()) g.dbias = dbias.view;
  return g;
}

}  // namespace memeff::soak
