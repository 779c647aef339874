// `memeff run --context-parallel N` (see cli_context_parallel.h): the inputs of `memeff run` (same
// seeds), cut into each rank's rows with the ring's Partition and run through ring_forward and
// ring_backward; every rank's outputs are compared with the same rows of the single-device run.
#include "cli_context_parallel.h"

#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>

#include "cli_json.h"
#include "cli_problem.h"
#include "cli_rendezvous.h"
#include "cli_tolerance.h"
#include "memeff/context_parallel.h"
#include "memeff/dispatch.h"
#include "memeff/error.h"

extern char** environ;

namespace memeff::cli {
namespace {

using cp::Partition;

// Rows of dimension 2 of a [d0, d1, L, (W)] host array that `rank` holds; an array whose
// dimension 2 has size 1 where the partition's length is not 1 (a bias broadcast over the query
// rows) is every rank's as it is.
HostArray shard_rows(const HostArray& whole, const Partition& part, int rank) {
  const std::vector<std::int64_t>& dims = whole.shape.dims;
  if (dims[2] == 1 && part.length() != 1) return whole;
  std::vector<std::int64_t> local_dims = dims;
  local_dims[2] = part.local_length(rank);
  HostArray local(whole.dtype, Shape{local_dims});
  const std::int64_t outer = dims[0] * dims[1];
  const std::int64_t inner = dims.size() > 3 ? dims[3] : 1;
  const std::size_t elem = dtype_size(whole.dtype);
  for (std::int64_t o = 0; o < outer; ++o) {
    for (const cp::Chunk& c : part.chunks(rank)) {
      const std::size_t bytes = static_cast<std::size_t>(c.length * inner) * elem;
      if (bytes == 0) continue;
      const std::size_t from =
          static_cast<std::size_t>((o * dims[2] + c.global_start) * inner) * elem;
      const std::size_t to =
          static_cast<std::size_t>((o * local_dims[2] + c.local_start) * inner) * elem;
      std::copy_n(whole.bytes.begin() + static_cast<std::ptrdiff_t>(from), bytes,
                  local.bytes.begin() + static_cast<std::ptrdiff_t>(to));
    }
  }
  return local;
}

// The bias columns are every key; only its rows are sharded (dimension 2), as ring_forward wants.
HostArray shard_bias(const HostArray& whole, const Partition& q_part, int rank) {
  return shard_rows(whole, q_part, rank);
}

// One rank's tensors on the device: its slices of the inputs and its outputs, NaN-poisoned.
struct RankTensors {
  DeviceTensor q, k, v, bias, dout, out, lse, dq, dk, dv, dbias;
};

RankTensors upload_rank(const AttentionData& whole, const Partition& qp, const Partition& kp,
                        int rank, Device device) {
  const ShapeConfig& c = whole.config;
  RankTensors t;
  auto up = [&](DeviceTensor& dst, const HostArray& host) {
    dst = DeviceTensor(device, host.dtype, host.shape);
    dst.upload(host);
  };
  up(t.q, shard_rows(whole.q_host, qp, rank));
  up(t.k, shard_rows(whole.k_host, kp, rank));
  up(t.v, shard_rows(whole.v_host, kp, rank));
  up(t.dout, shard_rows(whole.dout_host, qp, rank));
  const DType dtype = whole.dtype;
  const std::int64_t lq = qp.local_length(rank);
  t.out = DeviceTensor(device, dtype, Shape{{c.B, c.Hq, lq, c.dv()}});
  t.lse = DeviceTensor(device, DType::f32, Shape{{c.B, c.Hq, lq}});
  t.dq = DeviceTensor(device, dtype, t.q.shape);
  t.dk = DeviceTensor(device, dtype, t.k.shape);
  t.dv = DeviceTensor(device, dtype, t.v.shape);
  if (c.bias.present) {
    up(t.bias, shard_bias(whole.bias_host, qp, rank));
    t.dbias = DeviceTensor(device, t.bias.dtype, t.bias.shape);
  }
  for (DeviceTensor* d : {&t.out, &t.lse, &t.dq, &t.dk, &t.dv, &t.dbias})
    d->buffer.fill_bytes(0xFF);
  return t;
}

cp::ContextParallelArgs rank_args(const ShapeConfig& c, const RankTensors& t, const Partition& qp,
                                  const Partition& kp) {
  cp::ContextParallelArgs a;
  a.local = make_args(c, t.q.view(), t.k.view(), t.v.view(),
                      c.bias.present ? t.bias.view() : TensorView{});
  a.q_partition = qp;
  a.k_partition = kp;
  return a;
}

BackwardTensors rank_grads(const ShapeConfig& c, const RankTensors& t) {
  return {t.dout.view(),
          t.out.view(),
          t.lse.view(),
          t.dq.view(),
          t.dk.view(),
          t.dv.view(),
          c.bias.present ? std::optional(t.dbias.view()) : std::nullopt};
}

// One rank's ring pass pair, timed (wall clock on the host, CUDA events on a GPU).
struct RankResult {
  CallInfo fwd, bwd;
  double fwd_ms = 0.0, bwd_ms = 0.0;
};

RankResult run_rank(const cp::ContextParallelArgs& args, const BackwardTensors& g,
                    cp::Transport& transport, const Options& options, Device device) {
  RankResult r;
  const Buffer ws_f(device,
                    cp::ring_workspace_size(args, Pass::forward, transport.rank(), options));
  const Buffer ws_b(device,
                    cp::ring_workspace_size(args, Pass::backward, transport.rank(), options));
  Timer timer(device);
  timer.start();
  r.fwd = cp::ring_forward(args, g.out, g.lse, transport, with_workspace(options, ws_f));
  r.fwd_ms = timer.stop();
  timer.start();
  r.bwd = cp::ring_backward(args, g, transport, with_workspace(options, ws_b));
  r.bwd_ms = timer.stop();
  synchronize(device);
  return r;
}

struct Check {
  std::string name;
  Comparison cmp;
  CheckTolerance tol;
  std::string where;  // "rank r [b, h, i, d]" of the worst element
  bool pass() const { return !cmp.nonfinite && cmp.max_abs <= tol.bound(cmp.max_ref); }
};

// Accumulates one tensor's comparison over the ranks.
void fold(std::vector<Check>& checks, const std::string& name, const HostArray& actual,
          const HostArray& expected, DType dtype, bool gradient, const std::string& rank_label) {
  const Comparison c = compare_box(actual, expected);
  auto it =
      std::find_if(checks.begin(), checks.end(), [&](const Check& k) { return k.name == name; });
  if (it == checks.end()) {
    checks.push_back({name, {}, check_tolerance(dtype, gradient), ""});
    it = checks.end() - 1;
  }
  it->cmp.max_ref = std::max(it->cmp.max_ref, c.max_ref);
  const bool worse =
      (c.nonfinite && !it->cmp.nonfinite) || (!it->cmp.nonfinite && c.max_abs > it->cmp.max_abs);
  if (worse && c.worst >= 0)
    it->where = rank_label + " at " + index_string(c.worst, expected.shape.dims);
  it->cmp.max_abs = std::max(it->cmp.max_abs, c.max_abs);
  it->cmp.nonfinite = it->cmp.nonfinite || c.nonfinite;
}

// The single-device run of the whole problem: its outputs on the host.
struct Expected {
  HostArray out, lse, dq, dk, dv, dbias;
  std::string backend;
};

Expected single_device(const AttentionData& d, const Options& options) {
  const ShapeConfig& c = d.config;
  const Device device = d.device;
  const AttentionArgs args = d.args();
  const BackwardTensors g = d.grads();
  Expected e;
  e.backend = forward(args, g.out, g.lse, options).backend;
  backward(args, g, options);
  synchronize(device);
  e.out = d.out.download();
  e.lse = d.lse.download();
  e.dq = d.dq.download();
  e.dk = d.dk.download();
  e.dv = d.dv.download();
  if (c.bias.present) e.dbias = d.dbias.download();
  return e;
}

// The block calls of a rank, as "calls (diagonal)" for the report.
Json schedule_json(const Partition& qp, const Partition& kp, CausalMode causal) {
  Json ranks = Json::array();
  for (int r = 0; r < qp.ranks(); ++r) {
    const auto pairs = cp::ring_schedule(qp, kp, r, causal);
    std::int64_t diagonal = 0;
    for (const auto& p : pairs) diagonal += p.causal != CausalMode::none;
    Json j;
    j["rank"] = r;
    j["rows"] = qp.local_length(r);
    j["block_calls"] = static_cast<std::int64_t>(pairs.size());
    j["diagonal"] = diagonal;
    ranks.push_back(j);
  }
  return ranks;
}

std::string sci(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

struct Report {
  std::string mode;  // "local (N ranks in one process)" or "nccl rank r of N"
  std::string backend, backend_backward, reference_backend;
  Device device{};
  DType dtype = DType::f32;
  double fwd_ms = 0.0, bwd_ms = 0.0;
  std::vector<Check> checks;
  std::string dbias_note;
};

// One rank's outputs against its rows (queries) and keys of the single-device run; dbias where
// the rank holds whole elements of it (a bias broadcast over the query rows gives each rank a
// part of a sum: the callers handle that).
void fold_rank(Report& rep, const RankTensors& t, const Expected& expected, const Partition& qp,
               const Partition& kp, int r, const ShapeConfig& c) {
  const std::string label = "rank " + std::to_string(r);
  fold(rep.checks, "out", t.out.download(), shard_rows(expected.out, qp, r), rep.dtype, false,
       label);
  fold(rep.checks, "lse", t.lse.download(), shard_rows(expected.lse, qp, r), rep.dtype, false,
       label);
  fold(rep.checks, "dq", t.dq.download(), shard_rows(expected.dq, qp, r), rep.dtype, true, label);
  fold(rep.checks, "dk", t.dk.download(), shard_rows(expected.dk, kp, r), rep.dtype, true, label);
  fold(rep.checks, "dv", t.dv.download(), shard_rows(expected.dv, kp, r), rep.dtype, true, label);
  if (c.bias.present && !c.bias.bcast_q) {
    fold(rep.checks, "dbias", t.dbias.download(), shard_bias(expected.dbias, qp, r), rep.dtype,
         true, label);
  }
}

int print_report(const ContextParallelRun& run, const Report& rep, const Partition& qp,
                 const Partition& kp) {
  const ShapeConfig& c = run.shape;
  bool pass = true;
  for (const Check& k : rep.checks) pass = pass && k.pass();
  if (run.json) {
    Json errors = Json::object(), tolerances = Json::object();
    for (const Check& k : rep.checks) {
      errors[k.name] = k.cmp.nonfinite ? std::nan("") : k.cmp.max_abs;
      tolerances[k.name] = k.tol.bound(k.cmp.max_ref);
    }
    Json j;
    j["backend"] = rep.backend;
    j["backend_backward"] = rep.backend_backward;
    j["device"] = device_name(rep.device);
    j["dtype"] = dtype_name(rep.dtype);
    j["context_parallel"] = qp.ranks();
    j["layout"] = cp::layout_name(qp.layout());
    j["transport"] = rep.mode;
    add_shape_json(j, c);
    j["seed"] = c.seed;
    j["offset"] = c.offset;
    j["schedule"] = schedule_json(qp, kp, c.causal);
    j["fwd_ms"] = rep.fwd_ms;
    j["bwd_ms"] = rep.bwd_ms;
    j["reference"] = "single-device run on " + rep.reference_backend;
    j["max_abs_err"] = errors;
    j["tolerance"] = tolerances;
    if (!rep.dbias_note.empty()) j["dbias_note"] = rep.dbias_note;
    j["pass"] = pass;
    std::printf("%s\n", json_text(j).c_str());
    return pass ? 0 : 1;
  }
  std::printf("memeff %s run --context-parallel %d (%s)\n", version(), qp.ranks(),
              rep.mode.c_str());
  std::printf("  backend    %s (forward blocks), %s (backward blocks)\n", rep.backend.c_str(),
              rep.backend_backward.c_str());
  std::printf("  device     %s\n", device_description(rep.device).c_str());
  std::printf("  problem    %s\n", c.describe(rep.dtype).c_str());
  std::printf("  layout     %s: queries", cp::layout_name(qp.layout()));
  for (int r = 0; r < qp.ranks(); ++r) {
    std::printf(" r%d[", r);
    bool first = true;
    for (const cp::Chunk& ch : qp.chunks(r)) {
      std::printf("%s%lld:%lld", first ? "" : ",", static_cast<long long>(ch.global_start),
                  static_cast<long long>(ch.global_start + ch.length));
      first = false;
    }
    std::printf("]");
  }
  std::printf("\n  schedule  ");
  for (int r = 0; r < qp.ranks(); ++r) {
    const auto pairs = cp::ring_schedule(qp, kp, r, c.causal);
    std::int64_t diagonal = 0;
    for (const auto& p : pairs) diagonal += p.causal != CausalMode::none;
    std::printf(" r%d: %zu block calls (%lld diagonal)%s", r, pairs.size(),
                static_cast<long long>(diagonal), r + 1 < qp.ranks() ? ";" : "");
  }
  std::printf("\n  forward    %10.3f ms\n  backward   %10.3f ms   (one ring pass each; %s)\n",
              rep.fwd_ms, rep.bwd_ms,
              rep.device.type == DeviceType::cuda ? "CUDA events" : "wall clock");
  std::printf("  check      every rank's rows against the single-device run on %s\n",
              rep.reference_backend.c_str());
  for (const Check& k : rep.checks) {
    std::printf("    %-6s max abs err %-9s  tol %-9s (max |ref| %.3g)  %s", k.name.c_str(),
                k.cmp.nonfinite ? "non-finite" : sci(k.cmp.max_abs).c_str(),
                sci(k.tol.bound(k.cmp.max_ref)).c_str(), k.cmp.max_ref, k.pass() ? "PASS" : "FAIL");
    if (!k.pass() && !k.where.empty()) std::printf("  %s", k.where.c_str());
    std::printf("\n");
  }
  if (!rep.dbias_note.empty()) std::printf("    (%s)\n", rep.dbias_note.c_str());
  std::printf("  result     %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

Options block_options(const ContextParallelRun& run) {
  Options o;
  if (!run.backend.empty()) o.backends = split(run.backend, ',');
  return o;
}

// All ranks in this process over LocalRing (the CPU, or one GPU).
int run_local(const ContextParallelRun& run, Device device, const Partition& qp,
              const Partition& kp) {
  const ShapeConfig& c = run.shape;
  const Options options = block_options(run);
  const AttentionData whole = make_attention_data(c, device);  // the inputs, on the host too
  const Expected expected = single_device(whole, options);
  const int n = qp.ranks();
  std::vector<RankTensors> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(upload_rank(whole, qp, kp, r, device));
  std::vector<RankResult> results(static_cast<std::size_t>(n));
  if (!run.json) {
    std::fprintf(stderr, "memeff run: %d ranks in one process (local ring) on %s\n", n,
                 device_name(device).c_str());
  }
  cp::LocalRing ring(n, device);
  ring.run([&](cp::Transport& t) {
    const int r = t.rank();
    results[r] =
        run_rank(rank_args(c, ranks[r], qp, kp), rank_grads(c, ranks[r]), t, options, device);
  });
  Report rep;
  rep.mode = "local ring, " + std::to_string(n) + " ranks in one process";
  rep.backend = results[0].fwd.backend;
  rep.backend_backward = results[0].bwd.backend;
  rep.reference_backend = expected.backend;
  rep.device = device;
  rep.dtype = whole.dtype;
  for (const RankResult& r : results) {
    rep.fwd_ms = std::max(rep.fwd_ms, r.fwd_ms);
    rep.bwd_ms = std::max(rep.bwd_ms, r.bwd_ms);
  }
  HostArray dbias_sum;
  for (int r = 0; r < n; ++r) {
    const RankTensors& t = ranks[r];
    fold_rank(rep, t, expected, qp, kp, r, c);
    if (c.bias.present && c.bias.bcast_q) {  // each rank holds its rows' part of the sum
      const HostArray part = t.dbias.download();
      if (r == 0) {
        dbias_sum = HostArray(DType::f64, part.shape);
      }
      for (std::int64_t i = 0; i < part.numel(); ++i)
        dbias_sum.set(i, dbias_sum.get(i) + part.get(i));
    }
  }
  if (c.bias.present && c.bias.bcast_q) {
    fold(rep.checks, "dbias", dbias_sum, expected.dbias, rep.dtype, true, "sum over ranks");
    rep.dbias_note =
        "dbias broadcasts over the query rows: each rank returns its rows' part, "
        "compared here summed over the ranks";
  }
  return print_report(run, rep, qp, kp);
}

// torchrun-style rank variables, when set.
struct LaunchEnv {
  int rank = 0, world = 0, local_rank = 0;
};

std::optional<LaunchEnv> launch_env() {
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  if (!rank && !world) return std::nullopt;
  if (!rank || !world) {
    throw UsageError(std::string("RANK and WORLD_SIZE go together (torchrun style); only ") +
                     (rank ? "RANK" : "WORLD_SIZE") + " is set");
  }
  // A variable's value, checked as the flags' integers are.
  auto number = [](const char* name, const char* value, int min_value) {
    std::string text = value;
    if (std::string error = integer(min_value, INT_MAX)(text); !error.empty()) {
      throw UsageError(std::string(name) + ": " + error);
    }
    return std::stoi(text);
  };
  LaunchEnv e;
  e.rank = number("RANK", rank, 0);
  e.world = number("WORLD_SIZE", world, 1);
  const char* local = std::getenv("LOCAL_RANK");
  e.local_rank = local ? number("LOCAL_RANK", local, 0) : e.rank;
  if (e.rank >= e.world) {
    throw UsageError("RANK=" + std::to_string(e.rank) +
                     " is not below WORLD_SIZE=" + std::to_string(e.world));
  }
  return e;
}

std::string id_file_of(const ContextParallelRun& run) {
  if (!run.id_file.empty()) return run.id_file;
  const char* env = std::getenv("MEMEFF_NCCL_ID_FILE");
  return env ? env : "";
}

// How long the ranks other than 0 wait for rank 0's id file.
constexpr std::chrono::seconds kIdFileTimeout{120};

// This rank's NCCL communicator. Rank 0 makes the unique id and writes it to the id file
// (cli_rendezvous.h: a private file with this run's token and world size), the others wait for
// it. ncclCommInitRank returns on rank 0 only once every rank has joined, so rank 0 then removes
// the file: a later run never finds it.
void* init_nccl_comm(const std::string& id_path, const LaunchEnv& env, const RendezvousRank& me,
                     Device device) {
  if (env.rank != 0) {
    const std::vector<std::uint8_t> id = await_nccl_id(
        id_path, me, env.rank, kIdFileTimeout,
        [](const std::string& line) { std::fprintf(stderr, "memeff run: %s\n", line.c_str()); });
    return cp::nccl_comm_init(id, env.world, env.rank, device);
  }
  const std::vector<std::uint8_t> id = cp::nccl_unique_id();
  const PublishedId published = publish_nccl_id(id_path, id, me);
  if (!published.replaced.empty()) {
    std::fprintf(stderr, "memeff run: rank 0 replaced a stale NCCL id file %s (%s)\n",
                 id_path.c_str(), published.replaced.c_str());
  }
  struct Retract {
    const std::string& path;
    const PublishedId& published;
    ~Retract() { retract_nccl_id(path, published); }
  } retract{id_path, published};
  return cp::nccl_comm_init(id, env.world, env.rank, device);
}

// One rank of an NCCL ring, in its own process on GPU LOCAL_RANK.
int run_nccl_rank(const ContextParallelRun& run, const LaunchEnv& env, const Partition& qp,
                  const Partition& kp) {
  const RendezvousRank me = this_rank(env.world);  // "started": files older than now are stale
  const ShapeConfig& c = run.shape;
  if (env.world != run.ranks) {
    throw UsageError("--context-parallel " + std::to_string(run.ranks) +
                     " but WORLD_SIZE=" + std::to_string(env.world) + ": one process per rank");
  }
  const std::string id_path = id_file_of(run);
  if (id_path.empty()) {
    throw UsageError(
        "--nccl-id-file (or MEMEFF_NCCL_ID_FILE) is needed with RANK/WORLD_SIZE: rank "
        "0 writes the NCCL unique id there and the other ranks read it");
  }
  check_id_directory(id_path);  // before the single-device run, not after it
  const CudaStatus cuda = cuda_status();
  if (!cuda.why_not.empty())
    throw Error(ErrorCode::cuda_error, "--context-parallel with NCCL: " + cuda.why_not);
  if (env.local_rank >= cuda.device_count) {
    throw Error(ErrorCode::cuda_error,
                "LOCAL_RANK=" + std::to_string(env.local_rank) + " but this machine has " +
                    std::to_string(cuda.device_count) + " CUDA device(s): one GPU per rank");
  }
  const Device device = Device::cuda(env.local_rank);
  const Options options = block_options(run);
  const AttentionData whole = make_attention_data(c, device);
  const Expected expected = single_device(whole, options);
  RankTensors t = upload_rank(whole, qp, kp, env.rank, device);
  void* comm = init_nccl_comm(id_path, env, me, device);
  struct CommGuard {
    void* comm;
    ~CommGuard() { cp::nccl_comm_destroy(comm); }
  } guard{comm};
  const std::unique_ptr<cp::Transport> transport = cp::make_nccl_transport(comm, device);
  const RankResult res =
      run_rank(rank_args(c, t, qp, kp), rank_grads(c, t), *transport, options, device);
  Report rep;
  rep.mode = "nccl, rank " + std::to_string(env.rank) + " of " + std::to_string(env.world);
  rep.backend = res.fwd.backend;
  rep.backend_backward = res.bwd.backend;
  rep.reference_backend = expected.backend;
  rep.device = device;
  rep.dtype = whole.dtype;
  rep.fwd_ms = res.fwd_ms;
  rep.bwd_ms = res.bwd_ms;
  fold_rank(rep, t, expected, qp, kp, env.rank, c);
  if (c.bias.present && c.bias.bcast_q) {
    rep.dbias_note =
        "dbias broadcasts over the query rows: this rank holds only its rows' part of "
        "the sum (not checked here)";
  }
  return print_report(run, rep, qp, kp);
}

// Starts one process per rank (this program, with RANK, WORLD_SIZE, LOCAL_RANK and the id file
// in the environment) and waits for them; the exit status is the worst of theirs.
int launch_ranks(const ContextParallelRun& run) {
  if (!cp::nccl_available()) {
    throw Error(ErrorCode::unsupported,
                "--context-parallel " + std::to_string(run.ranks) +
                    " on cuda runs one process per GPU over NCCL, and this build has no NCCL; "
                    "--cp-transport local runs every rank on one GPU in this process");
  }
  const CudaStatus cuda = cuda_status();
  if (!cuda.why_not.empty())
    throw Error(ErrorCode::cuda_error, "--context-parallel: " + cuda.why_not);
  if (cuda.device_count < run.ranks) {
    throw Error(ErrorCode::unsupported,
                "--context-parallel " + std::to_string(run.ranks) +
                    " with the NCCL transport runs one process per GPU and needs " +
                    std::to_string(run.ranks) + " CUDA devices; this machine has " +
                    std::to_string(cuda.device_count) +
                    " (--cp-transport local runs every rank on one GPU in this process)");
  }
  // The id file: the caller's (checked here once, not in every rank), else one in a private
  // directory made here and removed at the end. The ranks share a fresh run token.
  std::string id_path = id_file_of(run);
  struct OwnDirectory {
    std::string path;
    ~OwnDirectory() {
      std::error_code ignored;
      if (!path.empty()) std::filesystem::remove_all(path, ignored);
    }
  } own_dir;
  if (id_path.empty()) {
    std::string name = (std::filesystem::temp_directory_path() / "memeff-nccl-XXXXXX").string();
    if (!::mkdtemp(name.data())) {
      throw Error(ErrorCode::io_error, "cannot create a private directory " + name +
                                           " for the NCCL id file: " + std::strerror(errno));
    }
    own_dir.path = name;
    id_path = name + "/nccl-id";
  }
  check_id_directory(id_path);
  std::random_device entropy;
  char token[64];
  std::snprintf(token, sizeof token, "memeff-%d-%08x%08x", static_cast<int>(::getpid()), entropy(),
                entropy());
  std::vector<pid_t> children;
  for (int r = 0; r < run.ranks; ++r) {
    std::vector<std::string> env_strings;
    auto replaced = [](const std::string& kv) {
      for (const char* name :
           {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MEMEFF_NCCL_ID_FILE=", "MEMEFF_RUN_TOKEN="}) {
        if (kv.rfind(name, 0) == 0) return true;
      }
      return false;
    };
    for (char** e = environ; *e; ++e) {
      if (!replaced(*e)) env_strings.emplace_back(*e);
    }
    env_strings.push_back("RANK=" + std::to_string(r));
    env_strings.push_back("WORLD_SIZE=" + std::to_string(run.ranks));
    env_strings.push_back("LOCAL_RANK=" + std::to_string(r));
    env_strings.push_back("MEMEFF_NCCL_ID_FILE=" + id_path);
    env_strings.push_back(std::string("MEMEFF_RUN_TOKEN=") + token);
    std::vector<std::string> args{"memeff", "run"};
    args.insert(args.end(), run.argv.begin(), run.argv.end());
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0) {
      throw Error(ErrorCode::io_error, "cannot start rank " + std::to_string(r) + " (posix_spawn)");
    }
    children.push_back(pid);
  }
  int worst = 0;
  for (const pid_t pid : children) {
    int status = 0;
    if (::waitpid(pid, &status, 0) < 0 || !WIFEXITED(status)) {
      worst = std::max(worst, 1);
    } else {
      worst = std::max(worst, WEXITSTATUS(status));
    }
  }
  return worst;
}

}  // namespace

int run_context_parallel(const ContextParallelRun& run) {
  const ShapeConfig& c = run.shape;
  c.check();
  if (run.ranks < 1) throw UsageError("--context-parallel: expected N >= 1 ranks");
  if (c.causal == CausalMode::bottom_right && c.Lq != c.lk()) {
    throw UsageError(std::string("--causal ") + causal_mode_name(c.causal) +
                     " with --context-parallel needs Lq = Lk (a square attention, where it is " +
                     causal_mode_name(CausalMode::top_left) +
                     "); got Lq = " + std::to_string(c.Lq) + ", Lk = " + std::to_string(c.lk()));
  }
  cp::Layout layout = cp::default_layout(c.causal);  // "auto"
  for (cp::Layout named : {cp::Layout::contiguous, cp::Layout::zigzag}) {
    if (run.layout == cp::layout_name(named)) layout = named;
  }
  // On a GPU every chunk starts on the dropout map's 64-key blocks: the fused kernels take block
  // calls with dropout only there (elsewhere they would fall to cuda_math). The CPU keeps the
  // even cut, whose uneven starts its tests are about.
  auto cut = [&](bool gpu) {
    const std::int64_t align = gpu ? 64 : 1;
    return std::pair{Partition(c.Lq, run.ranks, layout, align),
                     Partition(c.lk(), run.ranks, layout, align)};
  };

  const std::optional<LaunchEnv> env = launch_env();
  if (env) {  // a launched rank: NCCL (GPUs) whatever the flags say
    const auto [qp, kp] = cut(true);
    return run_nccl_rank(run, *env, qp, kp);
  }
  std::string device_note;
  const Device device = resolve_device(run.device, &device_note);
  if (!device_note.empty() && !run.json)
    std::fprintf(stderr, "memeff run: %s\n", device_note.c_str());
  const bool nccl = run.transport == "nccl" ||
                    (run.transport == "auto" && device.type == DeviceType::cuda && run.ranks > 1);
  if (nccl) {
    if (device.type != DeviceType::cuda) {
      throw UsageError("--cp-transport nccl: needs --device cuda (the CPU runs the local ring)");
    }
    return launch_ranks(run);
  }
  const auto [qp, kp] = cut(device.type == DeviceType::cuda);
  return run_local(run, device, qp, kp);
}

}  // namespace memeff::cli
