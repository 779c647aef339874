// Host/CUDA buffers, timers and device discovery of the memeff program (see cli_device.h). Every
// CUDA runtime call is checked and a failure throws memeff::Error(cuda_error) naming the call.
#include "cli_device.h"

#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>
#include <utility>

#include "memeff/backend.h"
#include "memeff/error.h"

#if defined(MEMEFF_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace memeff::cli {

namespace {

#if defined(MEMEFF_WITH_CUDA)
void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(ErrorCode::cuda_error,
                std::string(what) + " failed: " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
  }
}
#define CLI_CUDA(call) check_cuda((call), #call)

void set_device(Device device) { CLI_CUDA(cudaSetDevice(device.index)); }
#endif

[[noreturn, maybe_unused]] void no_cuda(const char* what) {
  throw Error(ErrorCode::cuda_error, std::string(what) + ": this memeff build has no CUDA support");
}

}  // namespace

CudaStatus cuda_status() {
  CudaStatus s;
#if defined(MEMEFF_WITH_CUDA)
  s.compiled = true;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // The runtime's own words ("CUDA driver version is insufficient for CUDA runtime version")
    // tell a new user little: say what is missing, and keep the error's name for the curious.
    const char* why = status == cudaErrorInsufficientDriver
                          ? "the NVIDIA driver is missing or older than this build's CUDA runtime"
                      : status == cudaErrorNoDevice ? "no CUDA device is present"
                                                    : cudaGetErrorString(status);
    s.why_not = std::string("no usable CUDA device was found: ") + why + " (cudaGetDeviceCount: " +
                cudaGetErrorName(status) + ")";
    (void)cudaGetLastError();  // clear the sticky-free error state for later calls
    return s;
  }
  s.device_count = count;
  if (count == 0) s.why_not = "no usable CUDA device was found: no CUDA device is present";
#else
  s.why_not = "this memeff build has no CUDA support (configured without nvcc or with -DMEMEFF_CUDA=OFF)";
#endif
  return s;
}

std::string device_description(Device device) {
  std::ostringstream os;
  if (device.type == DeviceType::cpu) {
    os << "cpu (" << omp_get_max_threads() << " threads, " << cpu_kernel_isa()
       << " kernels)";
    return os.str();
  }
#if defined(MEMEFF_WITH_CUDA)
  cudaDeviceProp prop{};
  CLI_CUDA(cudaGetDeviceProperties(&prop, device.index));
  os << device_name(device) << " (" << prop.name << ", sm_" << prop.major << prop.minor << ", "
     << (prop.totalGlobalMem >> 30) << " GiB)";
  return os.str();
#else
  no_cuda("device_description");
#endif
}

Buffer::Buffer(Device device, std::size_t bytes) : device_(device), bytes_(bytes) {
  const std::size_t alloc = bytes == 0 ? 256 : bytes;  // never a null pointer, even when empty
  if (device.type == DeviceType::cpu) {
    data_ = std::aligned_alloc(256, (alloc + 255) / 256 * 256);
    if (data_ == nullptr) throw std::bad_alloc();
    return;
  }
#if defined(MEMEFF_WITH_CUDA)
  set_device(device);
  const cudaError_t status = cudaMalloc(&data_, alloc);
  if (status != cudaSuccess) {
    data_ = nullptr;
    (void)cudaGetLastError();
    throw Error(ErrorCode::cuda_error, "cudaMalloc of " + std::to_string(alloc) + " bytes on " +
                                           device_name(device) + " failed: " + cudaGetErrorString(status));
  }
#else
  no_cuda("cudaMalloc");
#endif
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : device_(other.device_), data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    device_ = other.device_;
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void Buffer::release() noexcept {
  if (data_ == nullptr) return;
  if (device_.type == DeviceType::cpu) {
    std::free(data_);
  } else {
#if defined(MEMEFF_WITH_CUDA)
    (void)cudaFree(data_);  // a destructor must not throw; a failing free leaks at worst
#endif
  }
  data_ = nullptr;
}

void Buffer::upload(const void* host, std::size_t bytes) {
  if (bytes > bytes_) throw Error(ErrorCode::internal, "Buffer::upload: more bytes than the buffer holds");
  copy(data_, host, bytes, /*to_device=*/true);
}

void Buffer::download(void* host, std::size_t bytes) const {
  if (bytes > bytes_) throw Error(ErrorCode::internal, "Buffer::download: more bytes than the buffer holds");
  copy(host, data_, bytes, /*to_device=*/false);
}

void Buffer::copy(void* to, const void* from, std::size_t bytes,
                  [[maybe_unused]] bool to_device) const {
  if (bytes == 0) return;
  if (device_.type == DeviceType::cpu) {
    std::memcpy(to, from, bytes);
    return;
  }
#if defined(MEMEFF_WITH_CUDA)
  set_device(device_);
  CLI_CUDA(
      cudaMemcpy(to, from, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
#else
  no_cuda("cudaMemcpy");
#endif
}

void Buffer::fill_bytes(unsigned char value) {
  if (bytes_ == 0) return;
  if (device_.type == DeviceType::cpu) {
    std::memset(data_, value, bytes_);
    return;
  }
#if defined(MEMEFF_WITH_CUDA)
  set_device(device_);
  CLI_CUDA(cudaMemset(data_, value, bytes_));
#else
  no_cuda("cudaMemset");
#endif
}

Timer::Timer(Device device) : device_(device) {
  if (device.type == DeviceType::cpu) return;
#if defined(MEMEFF_WITH_CUDA)
  set_device(device);
  cudaEvent_t a = nullptr, b = nullptr;
  CLI_CUDA(cudaEventCreate(&a));
  start_event_ = a;
  CLI_CUDA(cudaEventCreate(&b));
  stop_event_ = b;
#else
  no_cuda("cudaEventCreate");
#endif
}

Timer::~Timer() {
#if defined(MEMEFF_WITH_CUDA)
  if (start_event_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(start_event_));
  if (stop_event_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(stop_event_));
#endif
}

void Timer::start() {
  if (device_.type == DeviceType::cpu) {
    t0_ = std::chrono::steady_clock::now();
    return;
  }
#if defined(MEMEFF_WITH_CUDA)
  CLI_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(start_event_), nullptr));
#endif
}

double Timer::stop() {
  if (device_.type == DeviceType::cpu) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
  }
#if defined(MEMEFF_WITH_CUDA)
  CLI_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(stop_event_), nullptr));
  CLI_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_event_)));
  float ms = 0.0f;
  CLI_CUDA(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_event_),
                                static_cast<cudaEvent_t>(stop_event_)));
  return ms;
#else
  no_cuda("cudaEventRecord");
#endif
}

void synchronize(Device device) {
  if (device.type == DeviceType::cpu) return;
#if defined(MEMEFF_WITH_CUDA)
  set_device(device);
  CLI_CUDA(cudaDeviceSynchronize());
  CLI_CUDA(cudaGetLastError());
#else
  no_cuda("cudaDeviceSynchronize");
#endif
}

std::size_t device_free_bytes(Device device) {
  if (device.type == DeviceType::cpu) return 0;
#if defined(MEMEFF_WITH_CUDA)
  set_device(device);
  std::size_t free_bytes = 0, total_bytes = 0;
  CLI_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
#else
  no_cuda("cudaMemGetInfo");
#endif
}

L2Flusher::L2Flusher(Device device) {
  if (device.type == DeviceType::cuda) scratch_ = Buffer(device, std::size_t{256} << 20);
}

void L2Flusher::flush() {
  if (scratch_.data() == nullptr || scratch_.device().type != DeviceType::cuda) return;
#if defined(MEMEFF_WITH_CUDA)
  CLI_CUDA(cudaMemsetAsync(scratch_.data(), 0, scratch_.bytes(), nullptr));
#endif
}

}  // namespace memeff::cli
