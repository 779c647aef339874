// Device copies of test::HostTensor for the gpu-labelled tests: same storage bytes, same strides,
// the view moved to cuda:0. CUDA failures throw, so a test fails loudly instead of reading junk.
// Also the fixture of the tests that run once per backend, skipped where it cannot run.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/call_helpers.h"
#include "common/host_tensor.h"

namespace memeff::test {

inline bool cuda_device_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Whether device 0 is compute capability 9.0, where the cuda_sm90 (Hopper) kernels run.
inline bool cuda_device_is_sm90() {
  cudaDeviceProp prop{};
  return cuda_device_present() && cudaGetDeviceProperties(&prop, 0) == cudaSuccess &&
         prop.major == 9 && prop.minor == 0;
}

// Why a gpu test of `backend` cannot run on this machine; empty when it can.
inline std::string gpu_backend_missing(const std::string& backend) {
  if (!cuda_device_present()) return "no CUDA device";
  if (backend == "cuda_sm90" && !cuda_device_is_sm90())
    return "cuda_sm90 needs compute capability 9.0";
  return {};
}

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

struct DeviceTensor {
  void* data = nullptr;
  std::size_t bytes = 0;
  TensorView view;

  explicit DeviceTensor(const HostTensor& h) : bytes(h.storage.size()), view(h.view) {
    cuda_check(cudaMalloc(&data, bytes), "cudaMalloc");
    upload(h);
    view.data = data;
    view.device = Device::cuda(0);
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() { cudaFree(data); }

  void upload(const HostTensor& h) {
    cuda_check(cudaMemcpy(data, h.storage.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  void copy_to(HostTensor& h) const {
    cuda_check(cudaMemcpy(h.storage.data(), data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
  HostTensor to_host(const HostTensor& like) const {
    HostTensor h = like;
    copy_to(h);
    return h;
  }
  std::vector<std::uint8_t> bytes_on_host() const {
    std::vector<std::uint8_t> out(bytes);
    cuda_check(cudaMemcpy(out.data(), data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return out;
  }
};

// Device copies of an attention case's nine tensors (test::Case, test::PackedCase: any type with
// these members), outputs as poisoned as the host's.
struct DeviceTensors {
  DeviceTensor q, k, v, out, lse, dout, dq, dk, dv;
  template <class CaseT>
  explicit DeviceTensors(const CaseT& c)
      : q(c.q),
        k(c.k),
        v(c.v),
        out(c.out),
        lse(c.lse),
        dout(c.dout),
        dq(c.dq),
        dk(c.dk),
        dv(c.dv) {}
};

// Attention arguments over device copies of q, k and v; the other fields keep their defaults.
inline AttentionArgs attention_args(const DeviceTensor& q, const DeviceTensor& k,
                                    const DeviceTensor& v) {
  AttentionArgs a;
  a.q = q.view;
  a.k = k.view;
  a.v = v.view;
  return a;
}

// A gpu test run once per backend (the parameter; name instances with test::backend_name):
// skipped, saying why, where that backend cannot run on this machine.
class PerBackend : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string missing = gpu_backend_missing(GetParam());
    if (!missing.empty()) GTEST_SKIP() << missing;
  }
};

}  // namespace memeff::test
