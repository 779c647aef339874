// Context-parallel (ring) attention: N ranks each hold a slice of the queries and of the keys and
// values of one attention; K/V blocks travel around the ring while each rank attends its queries
// to the block in hand, and the partial results are merged through their lse. Built on
// memeff::forward/backward block calls (AttentionArgs::q_start, k_start, kv_block), so the
// dropout mask of a sharded run is the single-device mask. docs/context_parallel.md has the
// layout, the schedule, the overlap and the limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "memeff/attention.h"
#include "memeff/tensor.h"

namespace memeff::cp {

namespace detail {
struct LocalRingState;  // src/cp/local_ring.cpp
}  // namespace detail

// How a sequence is cut over the ranks.
enum class Layout : std::uint8_t {
  contiguous,  // N chunks; rank r holds chunk r
  zigzag,      // 2N chunks; rank r holds chunks r and 2N-1-r: an early and a late one, so every
               // rank has the same causal work
};
const char* layout_name(Layout layout);  // "contiguous", "zigzag"

// A run of consecutive rows of the whole sequence held by one rank.
struct Chunk {
  std::int64_t global_start = 0;  // first row in the whole sequence
  std::int64_t local_start = 0;   // first row in the rank's own tensors
  std::int64_t length = 0;
};

// The cut of a sequence of `length` rows over `ranks` ranks. Chunk boundaries are
// floor(c·length / chunks) rounded down to a multiple of `align` (the last ends at `length`), so
// chunk sizes differ by at most `align` and a rank's tensors hold its chunks in ascending order.
// align = 64 puts every chunk on the dropout map's 64-key blocks (what the Hopper backward will
// want for its key blocks, docs/context_parallel.md).
class Partition {
 public:
  Partition() = default;
  // Throws memeff::Error naming the argument for length < 0, ranks outside [1, 2^20], align < 1.
  Partition(std::int64_t length, int ranks, Layout layout, std::int64_t align = 1);

  std::int64_t length() const { return length_; }
  int ranks() const { return ranks_; }
  Layout layout() const { return layout_; }
  const std::vector<Chunk>& chunks(int rank) const;  // in local (and global) order
  std::int64_t local_length(int rank) const;
  std::int64_t max_local_length() const;
  std::int64_t max_chunk_length() const;

 private:
  std::int64_t length_ = 0;
  int ranks_ = 1;
  Layout layout_ = Layout::contiguous;
  std::vector<std::vector<Chunk>> chunks_ = {{}};
};

// The layout a causal mode wants: zigzag when causal (load balance), contiguous otherwise.
Layout default_layout(CausalMode causal);

// One block call of the ring: this rank's query chunk against a key chunk of the K/V block in
// hand. Pairs whose keys are all masked are not listed.
struct BlockPair {
  int step = 0;     // ring step: the block of rank (rank - step) mod N is in hand
  int kv_rank = 0;  // whose K/V block
  Chunk q_chunk;    // of this rank
  Chunk k_chunk;  // of kv_rank (local_start: row in kv_rank's tensors and in the travelling block)
  CausalMode causal = CausalMode::none;  // none: every key visible; top_left: the diagonal crosses
};

// The block calls of `rank` in ring order. `causal` is the whole attention's mode (none or
// top_left; bottom_right only for a square attention, where it is top_left).
std::vector<BlockPair> ring_schedule(const Partition& q, const Partition& k, int rank,
                                     CausalMode causal);

// The ring's communication: each exchange sends buffers to the next rank and receives the same
// sizes from the previous one. Implementations: LocalRing (all ranks in one process, host or one
// GPU) and the NCCL transport (make_nccl_transport).
struct SendBuffer {
  const void* data = nullptr;
  std::size_t bytes = 0;
};
struct RecvBuffer {
  void* data = nullptr;
  std::size_t bytes = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;  // where the buffers live

  // Starts an exchange: `send` goes to rank (rank + 1) % size and `recv` is filled from rank
  // (rank - 1 + size) % size, whose send list has the same sizes. `send` is read after the work
  // already queued on `stream` (a cudaStream_t on a GPU, null: the default stream; ignored on the
  // host). Every rank starts the same sequence of exchanges. Returns a ticket for end_exchange.
  virtual std::uint64_t begin_exchange(std::span<const SendBuffer> send,
                                       std::span<const RecvBuffer> recv, void* stream) = 0;
  // Finishes an exchange: work queued on `stream` after this call sees `recv` filled and may
  // overwrite `send`. Tickets are ended in the order they were begun.
  virtual void end_exchange(std::uint64_t ticket, void* stream) = 0;
};

// All N ranks in one process, one thread each: the stand-in for the collectives that lets one
// machine (the CPU, or a single GPU) run the sharded algorithm exactly as N processes would,
// with the same partitioning, ring order and lse merge. Exchanges copy from the previous rank's
// send buffers (memcpy on the host; cudaMemcpyAsync on the receiver's stream after the sender's
// event on a GPU), so they do not overlap with compute.
class LocalRing {
 public:
  explicit LocalRing(int ranks, Device device = Device::cpu());
  ~LocalRing();
  LocalRing(const LocalRing&) = delete;
  LocalRing& operator=(const LocalRing&) = delete;

  int size() const;
  // Runs fn(transport) for every rank on its own thread (each thread gets an equal share of the
  // OpenMP threads and, on a GPU, the ring's device as current) and waits for all. When a rank
  // throws, the others are released from their exchanges with an error and the first rank's
  // exception is rethrown here.
  void run(const std::function<void(Transport& transport)>& fn);

 private:
  std::unique_ptr<detail::LocalRingState> state_;
};

// NCCL: whether this build has it, and the transport over a communicator the caller owns
// (ncclComm_t as void*; one rank per GPU). Exchanges are ncclSend/ncclRecv in a group on a
// communication stream of the transport's own, ordered after the compute stream by an event, and
// the compute stream waits for them by another: the transfer of the next K/V block overlaps the
// attention on the block in hand. Without NCCL in the build these throw ErrorCode::unsupported
// saying so.
bool nccl_available();
std::unique_ptr<Transport> make_nccl_transport(void* nccl_comm, Device device);
// The rendezvous pieces of a launcher: an ncclUniqueId's bytes (rank 0 makes it and shares it,
// e.g. through a file), a communicator of `ranks` on `device` from them, and its destruction.
std::vector<std::uint8_t> nccl_unique_id();
void* nccl_comm_init(const std::vector<std::uint8_t>& unique_id, int ranks, int rank,
                     Device device);
void nccl_comm_destroy(void* nccl_comm);

// One rank's share of a context-parallel attention.
//   local.q    [B, Hq,  q_partition.local_length(rank), D]   this rank's query rows, its chunks
//   local.k    [B, Hkv, k_partition.local_length(rank), D]   in ascending order
//   local.v    [B, Hkv, k_partition.local_length(rank), Dv]
//   local.bias [B|1, Hq|1, Lq_local|1, Lk_total]: this rank's query rows, every key
//   local.causal: none or top_left over the whole attention (bottom_right when it is square);
//   scale, dropout_p and rng as for the whole attention; q_start, k_start, kv_block unset and
//   packed unset (the ring sets the coordinates per block).
// out [B, Hq, Lq_local, Dv] and lse [B, Hq, Lq_local] are this rank's rows; in the backward dq,
// dk, dv are this rank's rows of the whole gradients, and dbias (the shape of local.bias) is the
// gradient of this rank's bias rows: exact where the bias has its own query rows, and this rank's
// part of the sum where it broadcasts over them (sum it over the ranks, as any replicated
// parameter's gradient).
struct ContextParallelArgs {
  AttentionArgs local;
  Partition q_partition, k_partition;
};

// Scratch bytes ring_forward/ring_backward want on the device of q: two K/V blocks in flight,
// (backward) three fp32 dK/dV accumulators of a block, fp32 accumulators of this rank's out, lse,
// dq (and dbias), one block call's outputs and the largest workspace of its block calls. Passing
// that much in Options::workspace keeps the ring free of allocations.
std::size_t ring_workspace_size(const ContextParallelArgs& args, Pass pass, int rank,
                                const Options& options = {});

// The forward of this rank: out and lse of its query rows over every key. Every rank calls it
// with its own slices and the same sizes, flags and RNG state. Options apply to the block calls
// (backends, stream, deterministic); Options::workspace is the ring's scratch. Returns the first
// block call's CallInfo (backend "none" when this rank has no block to compute).
CallInfo ring_forward(const ContextParallelArgs& args, const TensorView& out, const TensorView& lse,
                      Transport& transport, const Options& options = {});

// The backward of this rank: grads.out and grads.lse are ring_forward's (this rank's rows of the
// whole attention's); writes dq, dk, dv (and dbias) of this rank's slices. K/V and their fp32
// gradient accumulators travel around the ring; each block ends at its owner.
CallInfo ring_backward(const ContextParallelArgs& args, const BackwardTensors& grads,
                       Transport& transport, const Options& options = {});

}  // namespace memeff::cp
