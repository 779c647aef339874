// LocalRing: every rank of a ring in one process, one thread each, exchanging through shared
// postings instead of a network (include/memeff/context_parallel.h). A sender posts its buffers
// at begin_exchange; the receiver copies them at end_exchange and marks the posting copied; the
// sender's end_exchange returns once its own posting is copied, so its buffers may be reused. On a
// GPU the copy is a cudaMemcpyAsync on the receiver's stream behind the sender's event, and the
// sender's stream waits for the copy's event: nothing blocks the device, only the host threads.
#include <omp.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "memeff/context_parallel.h"
#include "memeff/error.h"

#if defined(MEMEFF_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "cuda/runtime/check.h"
#endif

namespace memeff::cp {
namespace {

#if defined(MEMEFF_WITH_CUDA)
using memeff::cuda::check_cuda;
#endif

// Thrown in the ranks that were waiting when another rank failed; never the error reported.
struct RingAborted : Error {
  RingAborted()
      : Error(ErrorCode::internal, "context parallel: another rank of the local ring failed") {}
};

// One rank's send buffers of one exchange, waiting for the next rank to copy them.
struct Posting {
  std::vector<SendBuffer> send;
  bool copied = false;
  void* ready_event = nullptr;   // GPU: recorded on the sender's stream at begin_exchange
  void* copied_event = nullptr;  // GPU: recorded on the receiver's stream after its copy
};

}  // namespace

struct detail::LocalRingState {
  int ranks = 1;
  Device device{};
  std::mutex mutex;
  std::condition_variable changed;
  bool aborted = false;
  std::vector<std::map<std::uint64_t, Posting>> postings;  // per rank, by ticket
  std::vector<std::unique_ptr<Transport>> transports;
};

namespace {

class LocalTransport final : public Transport {
 public:
  LocalTransport(detail::LocalRingState& state, int rank) : state_(state), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return state_.ranks; }
  Device device() const override { return state_.device; }

  std::uint64_t begin_exchange(std::span<const SendBuffer> send, std::span<const RecvBuffer> recv,
                               void* stream) override {
    Posting posting;
    posting.send.assign(send.begin(), send.end());
#if defined(MEMEFF_WITH_CUDA)
    if (state_.device.type == DeviceType::cuda) {
      cudaEvent_t ready = nullptr;
      check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming),
                 "local ring: cudaEventCreateWithFlags");
      check_cuda(cudaEventRecord(ready, static_cast<cudaStream_t>(stream)),
                 "local ring: cudaEventRecord");
      posting.ready_event = ready;
    }
#else
    (void)stream;
#endif
    const std::uint64_t ticket = next_ticket_++;
    pending_recv_[ticket].assign(recv.begin(), recv.end());
    {
      std::lock_guard lock(state_.mutex);
      state_.postings[rank_].emplace(ticket, std::move(posting));
    }
    state_.changed.notify_all();
    return ticket;
  }

  void end_exchange(std::uint64_t ticket, void* stream) override {
    const auto found = pending_recv_.find(ticket);
    if (found == pending_recv_.end()) {
      throw Error(ErrorCode::internal, "local ring: end_exchange of an unknown ticket");
    }
    const std::vector<RecvBuffer> recv = std::move(found->second);
    pending_recv_.erase(found);
    const int prev = (rank_ - 1 + state_.ranks) % state_.ranks;
    std::unique_lock lock(state_.mutex);
    // 1. The previous rank's posting of this exchange: copy it into our receive buffers.
    state_.changed.wait(lock,
                        [&] { return state_.aborted || state_.postings[prev].count(ticket); });
    if (state_.aborted) throw RingAborted();
    Posting& theirs = state_.postings[prev].at(ticket);
    if (theirs.send.size() != recv.size()) {
      throw Error(ErrorCode::internal, "local ring: rank " + std::to_string(prev) + " sends " +
                                           std::to_string(theirs.send.size()) + " buffers, rank " +
                                           std::to_string(rank_) + " receives " +
                                           std::to_string(recv.size()));
    }
    for (std::size_t i = 0; i < recv.size(); ++i) {
      if (theirs.send[i].bytes != recv[i].bytes) {
        throw Error(ErrorCode::internal,
                    "local ring: buffer " + std::to_string(i) + " of rank " + std::to_string(prev) +
                        " has " + std::to_string(theirs.send[i].bytes) + " bytes, rank " +
                        std::to_string(rank_) + " expects " + std::to_string(recv[i].bytes));
      }
    }
    const std::vector<SendBuffer> source = theirs.send;
    void* const ready = theirs.ready_event;
    lock.unlock();  // the sender keeps its buffers until we mark them copied
    void* copied_event = copy(source, recv, ready, stream);
    lock.lock();
    Posting& marked = state_.postings[prev].at(ticket);
    marked.copied = true;
    marked.copied_event = copied_event;
    state_.changed.notify_all();
    // 2. Our own posting: wait until the next rank has copied it, then let it go.
    state_.changed.wait(lock,
                        [&] { return state_.aborted || state_.postings[rank_].at(ticket).copied; });
    if (state_.aborted) throw RingAborted();
    const Posting mine = std::move(state_.postings[rank_].at(ticket));
    state_.postings[rank_].erase(ticket);
    lock.unlock();
    release(mine, stream);
  }

 private:
  // Copies the sender's buffers into ours; on a GPU returns the copy's event.
  void* copy(const std::vector<SendBuffer>& source, const std::vector<RecvBuffer>& recv,
             void* ready, void* stream) {
    if (state_.device.type == DeviceType::cpu) {
      for (std::size_t i = 0; i < recv.size(); ++i) {
        if (recv[i].bytes) std::memcpy(recv[i].data, source[i].data, recv[i].bytes);
      }
      return nullptr;
    }
#if defined(MEMEFF_WITH_CUDA)
    const auto s = static_cast<cudaStream_t>(stream);
    check_cuda(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(ready), 0),
               "local ring: cudaStreamWaitEvent");
    for (std::size_t i = 0; i < recv.size(); ++i) {
      if (recv[i].bytes) {
        check_cuda(cudaMemcpyAsync(recv[i].data, source[i].data, recv[i].bytes,
                                   cudaMemcpyDeviceToDevice, s),
                   "local ring: cudaMemcpyAsync");
      }
    }
    cudaEvent_t done = nullptr;
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
               "local ring: cudaEventCreateWithFlags");
    check_cuda(cudaEventRecord(done, s), "local ring: cudaEventRecord");
    return done;
#else
    (void)ready;
    (void)stream;
    throw Error(ErrorCode::unsupported, "local ring: CUDA buffers, but this build has no CUDA");
#endif
  }

  // After the next rank's copy: our stream waits for it before reusing the buffers.
  void release(const Posting& mine, void* stream) {
#if defined(MEMEFF_WITH_CUDA)
    if (mine.copied_event) {
      check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                     static_cast<cudaEvent_t>(mine.copied_event), 0),
                 "local ring: cudaStreamWaitEvent");
      cudaEventDestroy(static_cast<cudaEvent_t>(mine.copied_event));
    }
    if (mine.ready_event) cudaEventDestroy(static_cast<cudaEvent_t>(mine.ready_event));
#else
    (void)mine;
    (void)stream;
#endif
  }

  detail::LocalRingState& state_;
  int rank_;
  std::uint64_t next_ticket_ = 0;
  std::map<std::uint64_t, std::vector<RecvBuffer>> pending_recv_;
};

}  // namespace

LocalRing::LocalRing(int ranks, Device device)
    : state_(std::make_unique<detail::LocalRingState>()) {
  if (ranks < 1) {
    throw Error(ErrorCode::invalid_argument,
                "argument `ranks`: expected >= 1, got " + std::to_string(ranks));
  }
#if !defined(MEMEFF_WITH_CUDA)
  if (device.type == DeviceType::cuda) {
    throw Error(ErrorCode::unsupported,
                "argument `device`: " + device_name(device) + ", but this build has no CUDA");
  }
#endif
  state_->ranks = ranks;
  state_->device = device;
  state_->postings.resize(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    state_->transports.push_back(std::make_unique<LocalTransport>(*state_, r));
}

LocalRing::~LocalRing() = default;

int LocalRing::size() const { return state_->ranks; }

void LocalRing::run(const std::function<void(Transport&)>& fn) {
  detail::LocalRingState& st = *state_;
  {
    std::lock_guard lock(st.mutex);
    st.aborted = false;
    for (auto& p : st.postings) p.clear();
  }
  // The ranks share the machine: each runs its OpenMP regions on an equal share of the threads.
  const int omp_share = std::max(1, omp_get_max_threads() / st.ranks);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(st.ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < st.ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        omp_set_num_threads(omp_share);
#if defined(MEMEFF_WITH_CUDA)
        if (st.device.type == DeviceType::cuda)
          check_cuda(cudaSetDevice(st.device.index), "local ring: cudaSetDevice");
#endif
        fn(*st.transports[r]);
      } catch (const RingAborted&) {
        errors[r] = std::current_exception();
      } catch (...) {
        errors[r] = std::current_exception();
        {
          std::lock_guard lock(st.mutex);
          st.aborted = true;
        }
        st.changed.notify_all();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // The first rank that failed on its own, else (never expected) the first abort.
  std::exception_ptr report;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const RingAborted&) {
      if (!report) report = e;
    } catch (...) {
      report = e;
      break;
    }
  }
  if (report) std::rethrow_exception(report);
}

}  // namespace memeff::cp
