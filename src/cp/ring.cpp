// Ring attention on one rank (include/memeff/context_parallel.h, docs/context_parallel.md). Each
// step attends this rank's query chunks to the K/V block in hand with memeff::forward/backward
// block calls at global coordinates, while the transport moves the next block; partial outputs
// are merged through lse, gradients summed in fp32 accumulators. Only this rank's slices, two K/V
// blocks (three dK/dV accumulators in the backward) and one block call's outputs are held.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cp/ring_ops.h"
#include "memeff/backend.h"
#include "memeff/context_parallel.h"
#include "memeff/dropout.h"
#include "memeff/error.h"

namespace memeff::cp {
namespace {

using detail::DeviceBuffer;

constexpr std::size_t kAlign = detail::kBufferAlign;  // where each piece of the scratch starts

[[noreturn]] void fail(const std::string& arg, const std::string& what) {
  throw Error(ErrorCode::invalid_argument, "argument `" + arg + "`: " + what);
}

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A view of `count` rows from `start` along dimension `dim`.
TensorView slice(const TensorView& t, int dim, std::int64_t start, std::int64_t count) {
  TensorView v = t;
  v.shape[dim] = count;
  if (v.data != nullptr && start != 0) {
    v.data = static_cast<char*>(t.data) +
             start * t.stride[dim] * static_cast<std::int64_t>(dtype_size(t.dtype));
  }
  return v;
}

// A contiguous view over scratch.
TensorView dense(void* data, DType dtype, Device device,
                 std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(data, dtype, shape, device);
}

std::size_t bytes_of(DType dtype, std::initializer_list<std::int64_t> shape) {
  std::size_t n = dtype_size(dtype);
  for (const std::int64_t s : shape) n *= static_cast<std::size_t>(std::max<std::int64_t>(s, 0));
  return n;
}

// Hands out aligned pieces of the ring's workspace; with a null base it only counts.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  void* take(std::size_t bytes) {
    void* p = base_ ? base_ + used_ : nullptr;
    used_ += align_up(std::max<std::size_t>(bytes, 1));
    return p;
  }
  std::size_t used() const { return used_; }

 private:
  char* base_;
  std::size_t used_ = 0;
};

// The sizes one rank works with, checked once.
struct RingShape {
  int rank = 0, ranks = 1;
  std::int64_t B = 0, Hq = 0, Hkv = 0, D = 0, Dv = 0;
  std::int64_t lq = 0, lk = 0;          // this rank's query rows and key rows
  std::int64_t max_kv = 0;              // the longest K/V block of any rank
  std::int64_t max_qc = 0, max_kc = 0;  // the longest query and key chunks
  DType dtype = DType::f32, acc = DType::f32;
  Device device{};
  bool has_bias = false, bias_rows_bcast = false;
  std::array<std::int64_t, 4> bias_shape{};
  DType bias_dtype = DType::f32;
  CausalMode causal = CausalMode::none;
  std::vector<BlockPair> schedule{};
};

// The arguments without the parts the single-call validators cannot judge (the bias spans every
// key of the whole attention, not this rank's keys).
AttentionArgs without_bias(const AttentionArgs& a) {
  AttentionArgs s = a;
  s.bias.reset();
  return s;
}

RingShape ring_shape(const ContextParallelArgs& args, const Problem& p, int rank, int ranks) {
  const AttentionArgs& a = args.local;
  if (args.q_partition.ranks() != ranks) {
    fail("q_partition", "expected " + std::to_string(ranks) + " ranks (the transport's), got " +
                            std::to_string(args.q_partition.ranks()));
  }
  if (args.k_partition.ranks() != ranks) {
    fail("k_partition", "expected " + std::to_string(ranks) + " ranks (the transport's), got " +
                            std::to_string(args.k_partition.ranks()));
  }
  if (rank < 0 || rank >= ranks) {
    fail("rank", "expected [0, " + std::to_string(ranks) + "), got " + std::to_string(rank));
  }
  if (a.packed) fail("local.packed", "packed sequences are not supported with context parallelism");
  if (a.has_global_coordinates()) {
    fail(a.kv_block ? "local.kv_block" : (a.q_start ? "local.q_start" : "local.k_start"),
         "must be unset: the ring sets the global coordinates of each block call");
  }
  RingShape s{.rank = rank,
              .ranks = ranks,
              .B = p.B,
              .Hq = p.Hq,
              .Hkv = p.Hkv,
              .D = p.D,
              .Dv = p.Dv,
              .lq = p.Lq,
              .lk = p.Lk,
              .dtype = p.dtype,
              .acc = p.dtype == DType::f64 ? DType::f64 : DType::f32,
              .device = p.device};
  if (s.lq != args.q_partition.local_length(rank)) {
    fail("local.q", "expected " + std::to_string(args.q_partition.local_length(rank)) +
                        " query rows (rank " + std::to_string(rank) +
                        "'s share of q_partition), got " + std::to_string(s.lq));
  }
  if (s.lk != args.k_partition.local_length(rank)) {
    fail("local.k", "expected " + std::to_string(args.k_partition.local_length(rank)) +
                        " key rows (rank " + std::to_string(rank) +
                        "'s share of k_partition), got " + std::to_string(s.lk));
  }
  s.max_kv = args.k_partition.max_local_length();
  s.max_qc = args.q_partition.max_chunk_length();
  s.max_kc = args.k_partition.max_chunk_length();
  s.causal = a.causal;
  s.schedule = ring_schedule(args.q_partition, args.k_partition, rank, a.causal);
  if (a.bias) {
    const TensorView& bias = *a.bias;
    if (bias.rank != 4) fail("local.bias", "expected rank 4, got " + bias.describe());
    if (bias.dtype != p.dtype && bias.dtype != DType::f32) {
      fail("local.bias", std::string("expected dtype ") + dtype_name(p.dtype) + " or fp32, got " +
                             dtype_name(bias.dtype));
    }
    if (!(bias.device == p.device)) {
      fail("local.bias", "expected device " + device_name(p.device) + " (the device of q), got " +
                             device_name(bias.device));
    }
    const std::int64_t want[4] = {p.B, p.Hq, s.lq, args.k_partition.length()};
    for (int d = 0; d < 4; ++d) {
      if (bias.shape[d] != want[d] && !(d < 3 && bias.shape[d] == 1)) {
        fail("local.bias", "expected a shape broadcastable to [B, Hq, Lq_local, Lk_total] = [" +
                               std::to_string(want[0]) + ", " + std::to_string(want[1]) + ", " +
                               std::to_string(want[2]) + ", " + std::to_string(want[3]) +
                               "] (this rank's query rows, every key), got " + bias.describe());
      }
    }
    s.has_bias = true;
    s.bias_rows_bcast = bias.shape[2] == 1 && s.lq != 1;
    for (int d = 0; d < 4; ++d) s.bias_shape[d] = bias.shape[d];
    s.bias_dtype = bias.dtype;
  }
  return s;
}

// The scratch of one pass: K/V blocks (two, in flight), accumulators and one block call's outputs.
struct Buffers {
  std::array<void*, 2> kv{};   // K part, then V part at kv_v_offset
  std::array<void*, 3> dkv{};  // backward: dK part, then dV part at dkv_v_offset
  std::size_t kv_v_offset = 0, dkv_v_offset = 0;
  void* out_acc = nullptr;    // forward [B, Hq, lq, Dv] acc
  void* lse_acc = nullptr;    // forward [B, Hq, lq] acc
  void* out_blk = nullptr;    // forward [B, Hq, qc, Dv] dtype
  void* lse_blk = nullptr;    // forward [B, Hq, qc] fp32
  void* dq_acc = nullptr;     // backward [B, Hq, lq, D] acc
  void* dbias_acc = nullptr;  // backward: the bias's shape, acc
  void* dq_blk = nullptr;     // backward [B, Hq, qc, D] dtype
  void* dk_blk = nullptr;     // backward [B, Hkv, kc, D] dtype
  void* dv_blk = nullptr;     // backward [B, Hkv, kc, Dv] dtype
  void* dbias_blk = nullptr;  // backward [b, h, qc|1, kc] bias dtype
  void* block_ws = nullptr;
  std::size_t block_ws_bytes = 0;
  std::size_t total = 0;
};

Buffers carve(const RingShape& s, Pass pass, bool want_dbias, std::size_t block_ws, void* base) {
  Carver c(base);
  Buffers b;
  const std::size_t k_bytes = bytes_of(s.dtype, {s.B, s.Hkv, s.max_kv, s.D});
  const std::size_t v_bytes = bytes_of(s.dtype, {s.B, s.Hkv, s.max_kv, s.Dv});
  b.kv_v_offset = align_up(k_bytes);
  if (s.ranks > 1) {
    for (void*& p : b.kv) p = c.take(b.kv_v_offset + v_bytes);
  }
  if (pass == Pass::forward) {
    b.out_acc = c.take(bytes_of(s.acc, {s.B, s.Hq, s.lq, s.Dv}));
    b.lse_acc = c.take(bytes_of(s.acc, {s.B, s.Hq, s.lq}));
    b.out_blk = c.take(bytes_of(s.dtype, {s.B, s.Hq, s.max_qc, s.Dv}));
    b.lse_blk = c.take(bytes_of(DType::f32, {s.B, s.Hq, s.max_qc}));
  } else {
    const std::size_t dk_bytes = bytes_of(s.acc, {s.B, s.Hkv, s.max_kv, s.D});
    b.dkv_v_offset = align_up(dk_bytes);
    const std::size_t dkv_bytes = b.dkv_v_offset + bytes_of(s.acc, {s.B, s.Hkv, s.max_kv, s.Dv});
    for (int i = 0; i < (s.ranks > 1 ? 3 : 1); ++i) b.dkv[i] = c.take(dkv_bytes);
    b.dq_acc = c.take(bytes_of(s.acc, {s.B, s.Hq, s.lq, s.D}));
    b.dq_blk = c.take(bytes_of(s.dtype, {s.B, s.Hq, s.max_qc, s.D}));
    b.dk_blk = c.take(bytes_of(s.dtype, {s.B, s.Hkv, s.max_kc, s.D}));
    b.dv_blk = c.take(bytes_of(s.dtype, {s.B, s.Hkv, s.max_kc, s.Dv}));
    if (want_dbias) {
      const auto& bs = s.bias_shape;
      b.dbias_acc = c.take(bytes_of(s.acc, {bs[0], bs[1], bs[2], bs[3]}));
      b.dbias_blk = c.take(
          bytes_of(s.bias_dtype, {bs[0], bs[1], s.bias_rows_bcast ? 1 : s.max_qc, s.max_kc}));
    }
  }
  b.block_ws = c.take(block_ws);
  b.block_ws_bytes = block_ws;
  b.total = c.used() + kAlign;  // slack to align the caller's pointer
  return b;
}

// Views of a K/V block of `rows` rows in a ring buffer.
struct KvViews {
  TensorView k, v;
};

KvViews kv_views(const RingShape& s, void* buffer, std::size_t v_offset, DType dtype,
                 std::int64_t rows) {
  return {dense(buffer, dtype, s.device, {s.B, s.Hkv, rows, s.D}),
          dense(static_cast<char*>(buffer) + v_offset, dtype, s.device, {s.B, s.Hkv, rows, s.Dv})};
}

// The block call of one pair: this rank's query chunk against a key chunk of the block in hand,
// at the chunks' global coordinates.
AttentionArgs block_args(const ContextParallelArgs& args, const RingShape& s, const BlockPair& p,
                         const KvViews& kv, Pass pass) {
  AttentionArgs a = args.local;
  a.q = slice(args.local.q, 2, p.q_chunk.local_start, p.q_chunk.length);
  a.k = slice(kv.k, 2, p.k_chunk.local_start, p.k_chunk.length);
  a.v = slice(kv.v, 2, p.k_chunk.local_start, p.k_chunk.length);
  a.causal = p.causal;
  a.q_start = p.q_chunk.global_start;
  a.k_start = p.k_chunk.global_start;
  // A block that holds every key is the whole attention: its backward may use its own out and
  // lse (and the single-key rule); only a strict part needs the whole attention's.
  a.kv_block = pass == Pass::backward && p.k_chunk.length < args.k_partition.length();
  if (s.has_bias) {
    TensorView bias = *args.local.bias;
    if (!s.bias_rows_bcast) bias = slice(bias, 2, p.q_chunk.local_start, p.q_chunk.length);
    a.bias = slice(bias, 3, p.k_chunk.global_start, p.k_chunk.length);
  }
  return a;
}

// Where the block calls' sizes are taken from before any buffer exists: a real, aligned object
// whose address stands for the ring buffers (validation reads no data, and the alignment class it
// sees is the buffers').
alignas(kAlign) const unsigned char kSizingBase[kAlign] = {};

std::size_t block_workspace(const ContextParallelArgs& args, const RingShape& s, Pass pass,
                            const Options& options) {
  Options o = options;
  o.workspace = nullptr;
  o.workspace_bytes = 0;
  std::size_t most = 0;
  for (const BlockPair& p : s.schedule) {
    const std::int64_t rows = args.k_partition.local_length(p.kv_rank);
    void* base = const_cast<unsigned char*>(kSizingBase);
    KvViews kv =
        kv_views(s, base, align_up(bytes_of(s.dtype, {s.B, s.Hkv, s.max_kv, s.D})), s.dtype, rows);
    if (p.step == 0) kv = {args.local.k, args.local.v};
    most = std::max(most, workspace_size(block_args(args, s, p, kv, pass), pass, o));
  }
  return most;
}

// The ring's scratch for one pass (the caller's workspace, or an allocation for this call) carved
// into its buffers, and the options its block calls run with: their workspace is carved from it.
class Scratch {
 public:
  Scratch(const ContextParallelArgs& args, const RingShape& s, Pass pass, bool want_dbias,
          const Options& options)
      : block_options(options) {
    const std::size_t block_ws = block_workspace(args, s, pass, options);
    const std::size_t need = carve(s, pass, want_dbias, block_ws, nullptr).total;
    void* base = nullptr;
    if (options.workspace) {
      if (options.workspace_bytes < need) {
        fail("workspace", "the ring needs " + std::to_string(need) +
                              " bytes (ring_workspace_size), got " +
                              std::to_string(options.workspace_bytes));
      }
      const auto addr = reinterpret_cast<std::uintptr_t>(options.workspace);
      base = reinterpret_cast<void*>((addr + kAlign - 1) / kAlign * kAlign);
    } else {
      owned_.emplace(s.device, need, options.stream);
      base = owned_->data();
    }
    buf = carve(s, pass, want_dbias, block_ws, base);
    block_options.workspace = buf.block_ws;
    block_options.workspace_bytes = buf.block_ws_bytes;
  }

  Buffers buf;
  Options block_options;

 private:
  std::optional<DeviceBuffer> owned_;
};

void check_transport(const Transport& transport, const RingShape& s) {
  if (!(transport.device() == s.device)) {
    fail("transport", "its buffers live on " + device_name(transport.device()) +
                          ", the tensors on " + device_name(s.device));
  }
}

// The K and V parts (V at v_offset) of a ring buffer holding `rows` key rows, as transport
// buffers (SendBuffer or RecvBuffer).
template <class Part>
std::array<Part, 2> kv_parts(const RingShape& s, void* buffer, std::size_t v_offset, DType dtype,
                             std::int64_t rows) {
  return {Part{buffer, bytes_of(dtype, {s.B, s.Hkv, rows, s.D})},
          Part{static_cast<char*>(buffer) + v_offset, bytes_of(dtype, {s.B, s.Hkv, rows, s.Dv})}};
}

// The K/V blocks' trip round the ring: at step t this rank holds the block of rank (r − t) mod n,
// in ring buffer kv[t % 2] (at step 0 the caller's own tensors, also copied into kv[0] as the
// first block to travel), while the next one travels into the other buffer.
class KvTrip {
 public:
  KvTrip(const ContextParallelArgs& args, const RingShape& s, const Buffers& buf, void* stream)
      : args_(args), s_(s), buf_(buf) {
    if (s.ranks > 1) {
      const KvViews own = kv_views(s, buf.kv[0], buf.kv_v_offset, s.dtype, s.lk);
      detail::copy(own.k, args.local.k, stream);
      detail::copy(own.v, args.local.v, stream);
    }
  }
  // Key rows of the block in hand at `step` (step n: this rank's own block again).
  std::int64_t rows(int step) const {
    return args_.k_partition.local_length((s_.rank - step + s_.ranks) % s_.ranks);
  }
  KvViews block(int step) const {
    if (step == 0) return {args_.local.k, args_.local.v};
    return kv_views(s_, buf_.kv[step % 2], buf_.kv_v_offset, s_.dtype, rows(step));
  }
  // Sends the block in hand on and receives the next one, unless `step` is the last.
  std::optional<std::uint64_t> begin_next(Transport& transport, int step, void* stream) const {
    if (step + 1 >= s_.ranks) return std::nullopt;
    const auto send =
        kv_parts<SendBuffer>(s_, buf_.kv[step % 2], buf_.kv_v_offset, s_.dtype, rows(step));
    const auto recv = kv_parts<RecvBuffer>(s_, buf_.kv[(step + 1) % 2], buf_.kv_v_offset, s_.dtype,
                                           rows(step + 1));
    return transport.begin_exchange(send, recv, stream);
  }

 private:
  const ContextParallelArgs& args_;
  const RingShape& s_;
  const Buffers& buf_;
};

CallInfo call_info(const std::optional<CallInfo>& first, const AttentionArgs& a) {
  if (first) return *first;
  CallInfo info;  // no block to compute (no query rows, or every pair masked)
  info.backend = "none";
  info.p_effective = dropout_threshold(a.dropout_p).p_effective;
  return info;
}

}  // namespace

std::size_t ring_workspace_size(const ContextParallelArgs& args, Pass pass, int rank,
                                const Options& options) {
  const Problem p = validate_inputs(without_bias(args.local));
  const RingShape s = ring_shape(args, p, rank, args.q_partition.ranks());
  const bool want_dbias = s.has_bias;  // a backward may or may not ask: count the larger
  return carve(s, pass, want_dbias, block_workspace(args, s, pass, options), nullptr).total;
}

CallInfo ring_forward(const ContextParallelArgs& args, const TensorView& out, const TensorView& lse,
                      Transport& transport, const Options& options) {
  const Problem p = validate_forward(without_bias(args.local), out, lse);
  const RingShape s = ring_shape(args, p, transport.rank(), transport.size());
  check_transport(transport, s);
  void* const stream = options.stream;
  const Scratch scratch(args, s, Pass::forward, false, options);
  const Buffers& buf = scratch.buf;

  const TensorView out_acc = dense(buf.out_acc, s.acc, s.device, {s.B, s.Hq, s.lq, s.Dv});
  const TensorView lse_acc = dense(buf.lse_acc, s.acc, s.device, {s.B, s.Hq, s.lq});
  detail::fill(out_acc, 0.0, stream);
  detail::fill(lse_acc, -std::numeric_limits<double>::infinity(), stream);

  const KvTrip trip(args, s, buf, stream);
  std::optional<CallInfo> first;
  auto pair = s.schedule.begin();
  for (int step = 0; step < s.ranks; ++step) {
    // The next block travels while this one is attended to.
    const std::optional<std::uint64_t> ticket = trip.begin_next(transport, step, stream);
    const KvViews kv = trip.block(step);
    for (; pair != s.schedule.end() && pair->step == step; ++pair) {
      const std::int64_t qc = pair->q_chunk.length;
      const TensorView out_blk = dense(buf.out_blk, s.dtype, s.device, {s.B, s.Hq, qc, s.Dv});
      const TensorView lse_blk = dense(buf.lse_blk, DType::f32, s.device, {s.B, s.Hq, qc});
      const CallInfo info = forward(block_args(args, s, *pair, kv, Pass::forward), out_blk, lse_blk,
                                    scratch.block_options);
      if (!first) first = info;
      detail::merge(slice(out_acc, 2, pair->q_chunk.local_start, qc),
                    slice(lse_acc, 2, pair->q_chunk.local_start, qc), out_blk, lse_blk, stream);
    }
    if (ticket) transport.end_exchange(*ticket, stream);
  }
  detail::copy(out, out_acc, stream);
  detail::copy(lse, lse_acc, stream);
  return call_info(first, args.local);
}

CallInfo ring_backward(const ContextParallelArgs& args, const BackwardTensors& grads,
                       Transport& transport, const Options& options) {
  BackwardTensors g = grads;
  g.dbias.reset();
  const Problem p = validate_backward(without_bias(args.local), g);
  const RingShape s = ring_shape(args, p, transport.rank(), transport.size());
  check_transport(transport, s);
  const bool want_dbias = grads.dbias.has_value();
  if (want_dbias) {
    if (!s.has_bias) fail("dbias", "given, but the call has no bias");
    const TensorView& db = *grads.dbias;
    bool same = db.rank == 4 && db.dtype == s.bias_dtype && db.device == s.device;
    for (int d = 0; same && d < 4; ++d) same = db.shape[d] == s.bias_shape[d];
    if (!same) {
      fail("dbias", "expected the shape, dtype and device of local.bias (" +
                        args.local.bias->describe() + "), got " + db.describe());
    }
  }
  void* const stream = options.stream;
  const Scratch scratch(args, s, Pass::backward, want_dbias, options);
  const Buffers& buf = scratch.buf;

  const TensorView dq_acc = dense(buf.dq_acc, s.acc, s.device, {s.B, s.Hq, s.lq, s.D});
  detail::fill(dq_acc, 0.0, stream);
  TensorView dbias_acc;
  if (want_dbias) {
    const auto& bs = s.bias_shape;
    dbias_acc = dense(buf.dbias_acc, s.acc, s.device, {bs[0], bs[1], bs[2], bs[3]});
    detail::fill(dbias_acc, 0.0, stream);
  }

  const int n = s.ranks;
  auto dkv_views = [&](int which, std::int64_t rows) {
    return kv_views(s, buf.dkv[which], buf.dkv_v_offset, s.acc, rows);
  };
  const KvTrip trip(args, s, buf, stream);
  // dK/dV of the block in hand are summed in a step accumulator (dkv[step % 2]) while the
  // accumulator of the same block from the ranks before travels into dkv[2]; the two are added
  // and the sum moves on to the next rank, overlapping the next step. After the last step the
  // sum arrives at the block's owner.
  constexpr int kIncoming = 2;
  std::optional<CallInfo> first;
  std::optional<std::uint64_t> dkv_ticket;
  auto pair = s.schedule.begin();
  for (int step = 0; step < n; ++step) {
    const std::int64_t rows = trip.rows(step);
    const std::optional<std::uint64_t> kv_ticket = trip.begin_next(transport, step, stream);
    const KvViews kv = trip.block(step);
    const int acc_index = n > 1 ? step % 2 : 0;
    const KvViews dkv = dkv_views(acc_index, rows);
    detail::fill(dkv.k, 0.0, stream);
    detail::fill(dkv.v, 0.0, stream);
    for (; pair != s.schedule.end() && pair->step == step; ++pair) {
      const Chunk& qc = pair->q_chunk;
      const Chunk& kc = pair->k_chunk;
      const AttentionArgs a = block_args(args, s, *pair, kv, Pass::backward);
      BackwardTensors bg;
      bg.dout = slice(grads.dout, 2, qc.local_start, qc.length);
      bg.out = slice(grads.out, 2, qc.local_start, qc.length);
      bg.lse = slice(grads.lse, 2, qc.local_start, qc.length);
      bg.dq = dense(buf.dq_blk, s.dtype, s.device, {s.B, s.Hq, qc.length, s.D});
      bg.dk = dense(buf.dk_blk, s.dtype, s.device, {s.B, s.Hkv, kc.length, s.D});
      bg.dv = dense(buf.dv_blk, s.dtype, s.device, {s.B, s.Hkv, kc.length, s.Dv});
      const std::int64_t bias_rows = s.bias_rows_bcast ? 1 : qc.length;
      if (want_dbias) {
        bg.dbias = dense(buf.dbias_blk, s.bias_dtype, s.device,
                         {s.bias_shape[0], s.bias_shape[1], bias_rows, kc.length});
      }
      const CallInfo info = backward(a, bg, scratch.block_options);
      if (!first) first = info;
      detail::add(slice(dq_acc, 2, qc.local_start, qc.length), bg.dq, stream);
      detail::add(slice(dkv.k, 2, kc.local_start, kc.length), bg.dk, stream);
      detail::add(slice(dkv.v, 2, kc.local_start, kc.length), bg.dv, stream);
      if (want_dbias) {
        TensorView target = slice(dbias_acc, 3, kc.global_start, kc.length);
        if (!s.bias_rows_bcast) target = slice(target, 2, qc.local_start, qc.length);
        detail::add(target, *bg.dbias, stream);
      }
    }
    if (dkv_ticket) {  // the ranks before this one's share of the block in hand
      transport.end_exchange(*dkv_ticket, stream);
      const KvViews incoming = dkv_views(kIncoming, rows);
      detail::add(dkv.k, incoming.k, stream);
      detail::add(dkv.v, incoming.v, stream);
    }
    if (kv_ticket) transport.end_exchange(*kv_ticket, stream);
    if (n > 1) {  // pass the sum on; the last one goes home to the block's owner
      const auto send = kv_parts<SendBuffer>(s, buf.dkv[acc_index], buf.dkv_v_offset, s.acc, rows);
      const auto recv =
          kv_parts<RecvBuffer>(s, buf.dkv[kIncoming], buf.dkv_v_offset, s.acc, trip.rows(step + 1));
      dkv_ticket = transport.begin_exchange(send, recv, stream);
    }
  }
  KvViews own_dkv = dkv_views(0, s.lk);  // one rank: the only step's accumulator
  if (dkv_ticket) {
    transport.end_exchange(*dkv_ticket, stream);
    own_dkv = dkv_views(kIncoming, s.lk);
  }
  detail::copy(grads.dq, dq_acc, stream);
  detail::copy(grads.dk, own_dkv.k, stream);
  detail::copy(grads.dv, own_dkv.v, stream);
  if (want_dbias) detail::copy(*grads.dbias, dbias_acc, stream);
  return call_info(first, args.local);
}

}  // namespace memeff::cp
