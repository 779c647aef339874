// memeff from an installed package: a forward and a backward with dropout and a causal mask on
// the CPU, checked against the fp64 reference backend with the same mask, then the same call on
// cuda:0 when this memeff was built with CUDA and a device is present. Exits 1 on a mismatch.
#include <memeff/attention.h>
#include <memeff/error.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#if defined(MEMEFF_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace {

constexpr std::int64_t kB = 2, kHq = 4, kHkv = 2, kLq = 48, kLk = 80, kD = 32;
constexpr double kDropout = 0.1;
constexpr double kTolerance = 2e-4;  // of max|ref|: fp32 against the fp64 reference (gradients)

// Host buffers of one problem; `views` point them at `device` memory when given.
struct Buffers {
  std::vector<float> q, k, v, dout, out, lse, dq, dk, dv;
};

Buffers random_inputs() {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  auto fill = [&](std::int64_t n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) e = normal(gen);
    return x;
  };
  Buffers b;
  b.q = fill(kB * kHq * kLq * kD);
  b.k = fill(kB * kHkv * kLk * kD);
  b.v = fill(kB * kHkv * kLk * kD);
  b.dout = fill(kB * kHq * kLq * kD);
  b.out.assign(b.dout.size(), 0.0f);
  b.lse.assign(static_cast<std::size_t>(kB * kHq * kLq), 0.0f);
  b.dq.assign(b.q.size(), 0.0f);
  b.dk.assign(b.k.size(), 0.0f);
  b.dv.assign(b.v.size(), 0.0f);
  return b;
}

// Pointers to the nine tensors, on the host or on a device.
struct Pointers {
  float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
};

Pointers host_pointers(Buffers& b) {
  return {b.q.data(),   b.k.data(),  b.v.data(),  b.dout.data(), b.out.data(),
          b.lse.data(), b.dq.data(), b.dk.data(), b.dv.data()};
}

// Forward then backward on `where` with the given backends; the results land in `p`.
std::string run(const Pointers& p, memeff::Device where, std::vector<std::string> backends) {
  using memeff::DType;
  using memeff::TensorView;
  memeff::AttentionArgs args;
  args.q = TensorView::contiguous(p.q, DType::f32, {kB, kHq, kLq, kD}, where);
  args.k = TensorView::contiguous(p.k, DType::f32, {kB, kHkv, kLk, kD}, where);
  args.v = TensorView::contiguous(p.v, DType::f32, {kB, kHkv, kLk, kD}, where);
  args.causal = memeff::CausalMode::bottom_right;
  args.dropout_p = kDropout;
  args.rng = {.seed = 42, .offset = 0};
  memeff::Options options;
  options.backends = std::move(backends);

  const TensorView out = TensorView::contiguous(p.out, DType::f32, {kB, kHq, kLq, kD}, where);
  const TensorView lse = TensorView::contiguous(p.lse, DType::f32, {kB, kHq, kLq}, where);
  const memeff::CallInfo info = memeff::forward(args, out, lse, options);
  memeff::BackwardTensors grads;
  grads.dout = TensorView::contiguous(p.dout, DType::f32, {kB, kHq, kLq, kD}, where);
  grads.out = out;
  grads.lse = lse;
  grads.dq = TensorView::contiguous(p.dq, DType::f32, {kB, kHq, kLq, kD}, where);
  grads.dk = TensorView::contiguous(p.dk, DType::f32, {kB, kHkv, kLk, kD}, where);
  grads.dv = TensorView::contiguous(p.dv, DType::f32, {kB, kHkv, kLk, kD}, where);
  memeff::backward(args, grads, options);
  std::printf("%s on %s: p_effective %.4f\n", info.backend.c_str(),
              memeff::device_name(where).c_str(), info.p_effective);
  return info.backend;
}

// max|got - want| <= kTolerance * max|want|, reported per tensor.
bool agree(const char* what, const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) err = INFINITY;
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  const bool ok = err <= kTolerance * std::max(scale, 1.0);
  std::printf("  %-4s max|err| %.3g (max|ref| %.3g) %s\n", what, err, scale,
              ok ? "ok" : "MISMATCH");
  return ok;
}

bool compare(const Buffers& got, const Buffers& ref) {
  bool ok = agree("out", got.out, ref.out);
  ok = agree("lse", got.lse, ref.lse) && ok;
  ok = agree("dq", got.dq, ref.dq) && ok;
  ok = agree("dk", got.dk, ref.dk) && ok;
  return agree("dv", got.dv, ref.dv) && ok;
}

#if defined(MEMEFF_WITH_CUDA)
// The same problem on cuda:0; false when there is no usable device (not an error).
bool run_on_gpu(const Buffers& inputs, Buffers& result) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no usable CUDA device: the GPU run is skipped\n");
    return false;
  }
  result = inputs;
  std::vector<std::vector<float>*> host = {&result.q,    &result.k,   &result.v,
                                           &result.dout, &result.out, &result.lse,
                                           &result.dq,   &result.dk,  &result.dv};
  std::vector<float*> dev(host.size(), nullptr);
  for (std::size_t i = 0; i < host.size(); ++i) {
    const std::size_t bytes = host[i]->size() * sizeof(float);
    if (cudaMalloc(&dev[i], bytes) != cudaSuccess ||
        cudaMemcpy(dev[i], host[i]->data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      throw memeff::Error(memeff::ErrorCode::cuda_error, "example: cudaMalloc/cudaMemcpy failed");
    }
  }
  run({dev[0], dev[1], dev[2], dev[3], dev[4], dev[5], dev[6], dev[7], dev[8]},
      memeff::Device::cuda(0), {});
  for (std::size_t i = 0; i < host.size(); ++i) {
    cudaMemcpy(host[i]->data(), dev[i], host[i]->size() * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(dev[i]);
  }
  return true;
}
#endif

}  // namespace

int main() {
  std::printf(
      "memeff %s: B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld D=%lld, causal %s, dropout %.2f\n",
      memeff::version(), static_cast<long long>(kB), static_cast<long long>(kHq),
      static_cast<long long>(kHkv), static_cast<long long>(kLq), static_cast<long long>(kLk),
      static_cast<long long>(kD), memeff::causal_mode_name(memeff::CausalMode::bottom_right),
      kDropout);
  try {
    const Buffers inputs = random_inputs();
    Buffers reference = inputs, cpu = inputs;
    run(host_pointers(reference), memeff::Device::cpu(), {"reference"});
    run(host_pointers(cpu), memeff::Device::cpu(), {"cpu"});
    bool ok = compare(cpu, reference);
#if defined(MEMEFF_WITH_CUDA)
    Buffers gpu;
    if (run_on_gpu(inputs, gpu)) ok = compare(gpu, reference) && ok;
#endif
    std::printf("%s\n", ok ? "all results agree with the reference" : "results differ");
    return ok ? 0 : 1;
  } catch (const memeff::Error& e) {
    std::fprintf(stderr, "memeff error (%s): %s\n", memeff::error_code_name(e.code()), e.what());
    return 1;
  }
}
