// time_on_stream_ms (timing.h).
#include "cuda/runtime/timing.h"

#include "cuda/runtime/check.h"
#include "cuda/runtime/device.h"

namespace memeff::cuda {
namespace {

// Two events, destroyed with the scope whatever happens in between.
class EventPair {
 public:
  EventPair() {
    check_cuda(cudaEventCreate(&start_), "cudaEventCreate while timing");
    const cudaError_t created = cudaEventCreate(&stop_);
    if (created != cudaSuccess) cudaEventDestroy(start_);
    check_cuda(created, "cudaEventCreate while timing");
  }
  ~EventPair() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  cudaEvent_t start() const { return start_; }
  cudaEvent_t stop() const { return stop_; }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

double time_on_stream_ms(int device, cudaStream_t stream, const std::function<void()>& run) {
  DeviceScope scope(device);
  EventPair events;
  check_cuda(cudaEventRecord(events.start(), stream), "cudaEventRecord while timing");
  run();
  check_cuda(cudaEventRecord(events.stop(), stream), "cudaEventRecord while timing");
  check_cuda(cudaEventSynchronize(events.stop()), "cudaEventSynchronize while timing");
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, events.start(), events.stop()),
             "cudaEventElapsedTime while timing");
  return static_cast<double>(ms);
}

}  // namespace memeff::cuda
