// The NCCL transport of the ring (include/memeff/context_parallel.h): ncclSend to the next rank
// and ncclRecv from the previous one, grouped, on a communication stream of the transport's own.
// begin_exchange orders the transfer after the compute stream's queued work with an event and
// returns at once; end_exchange makes the compute stream wait for the transfer's event. Between
// the two the compute stream attends to the block in hand while the next one moves. Built only
// when CMake found NCCL (MEMEFF_WITH_NCCL); elsewhere the entry points say so.
#include <string>
#include <vector>

#include "memeff/context_parallel.h"
#include "memeff/error.h"

#if defined(MEMEFF_WITH_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <deque>

#include "cuda/runtime/check.h"
#include "cuda/runtime/device.h"
#endif

namespace memeff::cp {

#if defined(MEMEFF_WITH_NCCL)
namespace {

using memeff::cuda::check_cuda;
using memeff::cuda::DeviceScope;

void check_nccl(ncclResult_t status, const char* what) {
  if (status != ncclSuccess) {
    throw Error(ErrorCode::cuda_error,
                std::string("nccl transport: ") + what + " failed: " + ncclGetErrorString(status));
  }
}

class NcclTransport final : public Transport {
 public:
  NcclTransport(ncclComm_t comm, Device device) : comm_(comm), device_(device) {
    DeviceScope scope(device_.index);
    check_nccl(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check_nccl(ncclCommCount(comm_, &size_), "ncclCommCount");
    // Non-blocking: the legacy default stream must not serialize the transfers with compute.
    check_cuda(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
  }
  ~NcclTransport() override {
    cudaSetDevice(device_.index);
    cudaStreamSynchronize(comm_stream_);
    for (const Pending& p : pending_) {
      cudaEventDestroy(p.ready);
      cudaEventDestroy(p.done);
    }
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    cudaStreamDestroy(comm_stream_);
  }
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return device_; }

  std::uint64_t begin_exchange(std::span<const SendBuffer> send, std::span<const RecvBuffer> recv,
                               void* stream) override {
    if (send.size() != recv.size()) {
      throw Error(ErrorCode::internal, "nccl transport: as many receive as send buffers expected");
    }
    DeviceScope scope(device_.index);
    Pending p;
    p.ticket = next_ticket_++;
    p.ready = event();
    p.done = event();
    // The transfer reads what the compute stream has written so far.
    check_cuda(cudaEventRecord(p.ready, static_cast<cudaStream_t>(stream)), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(comm_stream_, p.ready, 0), "cudaStreamWaitEvent");
    const int next = (rank_ + 1) % size_, prev = (rank_ - 1 + size_) % size_;
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (std::size_t i = 0; i < send.size(); ++i) {
      // Bytes as ncclChar (the blocks are fp32/16-bit data moved verbatim); both ends agree on
      // the sizes from the shared partition.
      if (send[i].bytes) {
        check_nccl(ncclSend(send[i].data, send[i].bytes, ncclChar, next, comm_, comm_stream_),
                   "ncclSend");
      }
      if (recv[i].bytes) {
        check_nccl(ncclRecv(recv[i].data, recv[i].bytes, ncclChar, prev, comm_, comm_stream_),
                   "ncclRecv");
      }
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    check_cuda(cudaEventRecord(p.done, comm_stream_), "cudaEventRecord");
    pending_.push_back(p);
    return p.ticket;
  }

  void end_exchange(std::uint64_t ticket, void* stream) override {
    if (pending_.empty() || pending_.front().ticket != ticket) {
      throw Error(ErrorCode::internal,
                  "nccl transport: exchanges must end in the order they began");
    }
    DeviceScope scope(device_.index);
    const Pending p = pending_.front();
    pending_.pop_front();
    // Compute after this point sees the received block, and may overwrite the sent one.
    check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), p.done, 0),
               "cudaStreamWaitEvent");
    free_events_.push_back(p.ready);  // reusable: a later record replaces the captured state
    free_events_.push_back(p.done);
  }

 private:
  struct Pending {
    std::uint64_t ticket = 0;
    cudaEvent_t ready = nullptr, done = nullptr;
  };
  cudaEvent_t event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }

  ncclComm_t comm_;
  Device device_;
  int rank_ = 0, size_ = 1;
  cudaStream_t comm_stream_ = nullptr;
  std::uint64_t next_ticket_ = 0;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Transport> make_nccl_transport(void* nccl_comm, Device device) {
  if (nccl_comm == nullptr) {
    throw Error(ErrorCode::invalid_argument, "argument `nccl_comm`: null communicator");
  }
  if (device.type != DeviceType::cuda) {
    throw Error(
        ErrorCode::invalid_argument,
        "argument `device`: the NCCL transport moves CUDA buffers, got " + device_name(device));
  }
  return std::make_unique<NcclTransport>(static_cast<ncclComm_t>(nccl_comm), device);
}

std::vector<std::uint8_t> nccl_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::vector<std::uint8_t> bytes(sizeof id.internal);
  std::memcpy(bytes.data(), id.internal, sizeof id.internal);
  return bytes;
}

void* nccl_comm_init(const std::vector<std::uint8_t>& unique_id, int ranks, int rank,
                     Device device) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof id.internal) {
    throw Error(ErrorCode::invalid_argument,
                "argument `unique_id`: expected " + std::to_string(sizeof id.internal) +
                    " bytes (an ncclUniqueId), got " + std::to_string(unique_id.size()));
  }
  std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
  DeviceScope scope(device.index);
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, ranks, id, rank), "ncclCommInitRank");
  return comm;
}

void nccl_comm_destroy(void* nccl_comm) {
  if (nccl_comm) ncclCommDestroy(static_cast<ncclComm_t>(nccl_comm));
}

#else  // no NCCL in this build

namespace {

[[noreturn]] void no_nccl(const char* what) {
  throw Error(ErrorCode::unsupported,
              std::string(what) +
                  ": this memeff build has no NCCL (CMake found no nccl.h and libnccl beside the "
                  "CUDA toolkit, or CUDA is off; set NCCL_ROOT or MEMEFF_NCCL=ON to require it)");
}

}  // namespace

bool nccl_available() { return false; }
std::unique_ptr<Transport> make_nccl_transport(void*, Device) { no_nccl("make_nccl_transport"); }
std::vector<std::uint8_t> nccl_unique_id() { no_nccl("nccl_unique_id"); }
void* nccl_comm_init(const std::vector<std::uint8_t>&, int, int, Device) {
  no_nccl("nccl_comm_init");
}
void nccl_comm_destroy(void*) {}

#endif

}  // namespace memeff::cp
