// Many threads calling forward and backward through the dispatcher at once, as PyTorch's autograd
// threads and a user's own threads do: mixed dtypes, shapes, causal modes, dropout, GQA, biases
// and layouts, reaching the dispatcher through the default order, Options::backends, a
// ScopedBackends guard and a PreparedCall run with the caller's workspace, with autotune off and
// on (every thread tuning into one fresh cache folder), while another thread forgets the autotune
// memory and re-registers backends (which drops every thread's remembered decisions). Each result
// must equal, bit for bit, the same call made on one thread beforehand on the backend the call
// reports (the cpu backend's dq within the backward tolerance unless Options::deterministic: its
// per-thread partials take key blocks in a run-dependent order); the cache file must end with one
// entry per tuned key, as memory has them. scripts/ci-extra.sh runs this under ThreadSanitizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/attention_case.h"
#include "common/bitwise.h"
#include "common/call_helpers.h"
#include "common/fake_backend.h"
#include "common/host_tensor.h"
#include "common/tolerance.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/dispatch.h"
#include "memeff/error.h"

namespace memeff {
namespace {

namespace fs = std::filesystem;
using test::Case;

constexpr int kWorkers = 8;  // threads calling forward and backward
constexpr int kRounds = 3;   // each worker runs every case this many times, in its own order
const std::set<std::string> kCpuBackends = {"cpu", "reference"};

// One call of the stress: the problem, and how it reaches the dispatcher.
struct StressCase {
  test::Config cfg;
  bool autotune = false;
  bool deterministic = false;      // Options::deterministic
  std::vector<std::string> order;  // the backends allowed, in order; empty: the default order
  bool guard = false;              // `order` through a ScopedBackends, not Options::backends
  bool workspace = false;          // a PreparedCall run with the caller's workspace

  std::string describe() const {
    std::string s = cfg.describe() + (autotune ? " autotune" : "") +
                    (deterministic ? " deterministic" : "") + (workspace ? " workspace" : "");
    if (!order.empty()) {
      s += guard ? " guard " : " backends ";
      for (std::size_t i = 0; i < order.size(); ++i) s += (i ? "," : "") + order[i];
    }
    return s;
  }
};

// A row of the table below: test::Config's fields and the route's, as literals (a braced
// test::Config with its std::string inside trips GCC 12's -Wmaybe-uninitialized).
struct Row {
  std::int64_t B = 1, Hq = 2, Hkv = 2, Lq = 17, Lk = 17, D = 16, Dv = -1;
  CausalMode causal = CausalMode::none;
  const char* bias = "none";
  double dropout = 0.0;
  DType dtype = DType::f32;
  test::Layout layout = test::Layout::bhld;
  bool autotune = false, deterministic = false;
  const char* order = "";  // comma-separated backend names
  bool guard = false, workspace = false;

  StressCase stress_case() const {
    StressCase s;
    s.cfg = {.B = B,
             .Hq = Hq,
             .Hkv = Hkv,
             .Lq = Lq,
             .Lk = Lk,
             .D = D,
             .Dv = Dv,
             .causal = causal,
             .bias = bias,
             .dropout = dropout,
             .dtype = dtype,
             .layout = layout};
    s.autotune = autotune;
    s.deterministic = deterministic;
    s.guard = guard;
    s.workspace = workspace;
    std::istringstream names(order);
    for (std::string name; std::getline(names, name, ',');) s.order.push_back(name);
    return s;
  }
};

std::vector<StressCase> stress_cases() {
  constexpr DType f16 = DType::f16, bf16 = DType::bf16;
  constexpr CausalMode top_left = CausalMode::top_left, bottom_right = CausalMode::bottom_right;
  constexpr test::Layout blhd = test::Layout::blhd;
  // One row per case, as a table.
  // clang-format off
  const Row rows[] = {
      // The default order (the cpu backend), autotune off.
      {.Lq = 17, .Lk = 17, .D = 40},
      {.B = 2, .Lq = 33, .Lk = 50, .D = 64, .causal = top_left, .dropout = 0.2, .dtype = f16},
      {.Lq = 50, .Lk = 33, .D = 24, .causal = bottom_right, .bias = "bhqk", .dtype = bf16,
       .deterministic = true},
      {.Hq = 4, .Hkv = 2, .Lq = 64, .Lk = 64, .D = 32, .causal = top_left, .bias = "1h1k",
       .dropout = 0.1},
      {.Hq = 4, .Hkv = 1, .Lq = 9, .Lk = 70, .bias = "11qk", .dropout = 0.15, .dtype = f16,
       .layout = blhd, .deterministic = true},
      // Bottom-right with Lq > Lk: rows that see no key.
      {.Lq = 40, .Lk = 9, .D = 40, .causal = bottom_right, .dropout = 0.2, .dtype = bf16},
      {.Lq = 33, .Lk = 33, .D = 24, .Dv = 40, .bias = "b1qk"},
      // Several key blocks per thread: the cpu backward's dq sums them in a run-dependent order
      // unless deterministic.
      {.Hq = 2, .Hkv = 1, .Lq = 12, .Lk = 200, .dropout = 0.1, .deterministic = true},
      {.Lq = 20, .Lk = 200, .D = 24, .causal = bottom_right, .bias = "bh1k", .dtype = f16},
      // Options::backends, a scoped guard, the caller's workspace.
      {.Lq = 12, .Lk = 20, .causal = top_left, .dropout = 0.2, .order = "reference"},
      {.Hq = 4, .Hkv = 2, .Lq = 16, .Lk = 16, .D = 8, .bias = "bhqk", .dtype = f16,
       .order = "reference,cpu", .guard = true},
      {.B = 2, .Lq = 65, .Lk = 65, .D = 32, .dropout = 0.1, .dtype = bf16, .workspace = true},
      {.Hq = 3, .Hkv = 3, .Lq = 30, .Lk = 45, .D = 48, .causal = bottom_right, .bias = "1h1k",
       .dtype = f16, .layout = blhd, .deterministic = true, .order = "cpu", .guard = true,
       .workspace = true},
      // Autotune on: the first calls of each key time cpu and reference, on several threads at
      // once; two cases share a key (the same problem, another route).
      {.Lq = 20, .Lk = 20, .autotune = true},
      {.Lq = 20, .Lk = 20, .autotune = true, .order = "reference,cpu"},
      {.Hq = 4, .Hkv = 2, .Lq = 24, .Lk = 40, .D = 32, .dropout = 0.2, .dtype = f16,
       .autotune = true},
      {.Lq = 30, .Lk = 30, .D = 24, .causal = top_left, .bias = "11qk", .dtype = bf16,
       .autotune = true, .deterministic = true},
      {.B = 2, .Lq = 10, .Lk = 25, .causal = bottom_right, .dropout = 0.1, .autotune = true,
       .order = "cpu,reference", .guard = true},
      {.Hq = 2, .Hkv = 1, .Lq = 36, .Lk = 36, .D = 40, .bias = "bhqk", .dtype = f16,
       .autotune = true, .workspace = true},
  };
  // clang-format on
  std::vector<StressCase> cases;
  for (const Row& r : rows) cases.push_back(r.stress_case());
  return cases;
}

std::uint64_t data_seed(std::size_t case_index) { return 7000 + case_index; }

// The case's Options (its guard, when it has one, is the caller's to open).
Options options_of(const StressCase& s) {
  Options o;
  o.autotune = s.autotune;
  o.deterministic = s.deterministic;
  if (!s.guard) o.backends = s.order;
  return o;
}

// One pass of the case as its route says; what the call reports.
CallInfo run_pass(const StressCase& s, Case& c, Pass pass) {
  std::optional<ScopedBackends> guard;
  if (s.guard) guard.emplace(s.order);
  const Options o = options_of(s);
  if (!s.workspace) {
    return pass == Pass::forward ? forward(c.args(), c.out.view, c.lse.view, o)
                                 : backward(c.args(), c.grads(), o);
  }
  PreparedCall call = pass == Pass::forward
                          ? PreparedCall::forward(c.args(), c.out.view, c.lse.view, o)
                          : PreparedCall::backward(c.args(), c.grads(), o);
  std::vector<std::byte> scratch(call.workspace_bytes());
  return call.run(scratch.data(), scratch.size());
}

Explanation explain_route(const StressCase& s, const Case& c, Pass pass) {
  std::optional<ScopedBackends> guard;
  if (s.guard) guard.emplace(s.order);
  return explain(c.args(), pass, options_of(s));
}

// What one case's calls must give, made on one thread before the stress: out and lse of each
// backend, gradients of each (forward backend, backward backend) pair, each a call restricted to
// that backend with the case's other options.
struct Expected {
  std::map<std::string, Case> forward;
  std::map<std::pair<std::string, std::string>, Case> backward;
  std::set<std::string> forward_backends, backward_backends;  // what the case's calls may report
  std::vector<std::string> tune_keys;                         // with autotune: both passes' keys
};

Options pinned(const StressCase& s, const std::string& backend) {
  Options o = test::only({backend});
  o.deterministic = s.deterministic;
  o.autotune = false;
  return o;
}

Expected expected_results(const StressCase& s, std::size_t index) {
  Expected e;
  for (const std::string& b : kCpuBackends) {
    Case c(s.cfg, data_seed(index));
    forward(c.args(), c.out.view, c.lse.view, pinned(s, b));
    e.forward.emplace(b, c);
  }
  for (const auto& [fb, fwd] : e.forward) {
    for (const std::string& bb : kCpuBackends) {
      Case c = fwd;
      backward(c.args(), c.grads(), pinned(s, bb));
      e.backward.emplace(std::pair(fb, bb), c);
    }
  }
  const Case probe(s.cfg, data_seed(index));
  for (const Pass pass : {Pass::forward, Pass::backward}) {
    const Explanation ex = explain_route(s, probe, pass);
    // Autotuning may pick either CPU backend; otherwise the order decides.
    const std::set<std::string> allowed = s.autotune ? kCpuBackends : std::set{ex.chosen};
    (pass == Pass::forward ? e.forward_backends : e.backward_backends) = allowed;
    if (s.autotune) e.tune_keys.push_back(ex.key);
  }
  return e;
}

// Runs the case's forward and backward as its route says and checks both against `e`; `where`
// names the thread and round in messages.
void run_and_check(const StressCase& s, std::size_t index, const Expected& e,
                   const std::string& where) {
  const std::string what = where + " " + s.describe() + ":";
  Case c(s.cfg, data_seed(index));
  const CallInfo f = run_pass(s, c, Pass::forward);
  if (!e.forward_backends.contains(f.backend)) {
    ADD_FAILURE() << what << " forward ran on " << f.backend;
    return;
  }
  const Case& want = e.forward.at(f.backend);
  test::expect_bitwise_equal(c.out, want.out, what + " out (" + f.backend + ")");
  test::expect_bitwise_equal(c.lse, want.lse, what + " lse (" + f.backend + ")");

  const CallInfo b = run_pass(s, c, Pass::backward);
  if (!e.backward_backends.contains(b.backend)) {
    ADD_FAILURE() << what << " backward ran on " << b.backend;
    return;
  }
  const Case& grads = e.backward.at({f.backend, b.backend});
  const std::string on = " (" + f.backend + ", " + b.backend + ")";
  if (b.backend == "cpu" && !s.deterministic) {
    const test::Config& cfg = s.cfg;
    const test::Tolerance bt = test::backward_tolerance(
        cfg.dtype, std::max({cfg.D, cfg.dv(), cfg.Lk, cfg.Lq * (cfg.Hq / cfg.Hkv)}));
    test::expect_close(c.dq, grads.dq, bt, what + " dq" + on);
  } else {
    test::expect_bitwise_equal(c.dq, grads.dq, what + " dq" + on);
  }
  test::expect_bitwise_equal(c.dk, grads.dk, what + " dk" + on);
  test::expect_bitwise_equal(c.dv, grads.dv, what + " dv" + on);
  if (c.dbias) test::expect_bitwise_equal(*c.dbias, *grads.dbias, what + " dbias" + on);
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

class ConcurrencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/memeff-concurrency-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root = tmpl;
    unsetenv("MEMEFF_AUTOTUNE");
    unsetenv("MEMEFF_BACKENDS");
  }
  void TearDown() override {
    unsetenv("MEMEFF_CACHE_DIR");
    autotune_reset_memory();
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  // Points the autotune cache at a fresh folder (only while no other thread calls memeff: the
  // environment is not safe to change under readers).
  fs::path use_cache_folder(const std::string& name) {
    const fs::path dir = fs::path(root) / name;
    setenv("MEMEFF_CACHE_DIR", dir.c_str(), 1);
    autotune_reset_memory();
    return dir;
  }
  std::string root;
};

// Until `done`: forgets the autotune memory, re-registers the built-in backends and registers and
// removes a backend of another device (each registration drops every thread's remembered
// decisions), asks what the dispatcher would do and makes a call it must refuse.
int churn(const std::vector<StressCase>& cases, const std::atomic<bool>& done) {
  auto other_device = std::make_shared<test::FakeBackend>("stress_other_device", DeviceType::cuda);
  int rounds = 0;
  do {
    autotune_reset_memory();
    for (const std::string& name : kCpuBackends) register_backend(find_backend(name));
    register_backend(other_device);
    const StressCase& s = cases[static_cast<std::size_t>(rounds) % cases.size()];
    const Case c(s.cfg, 1);
    EXPECT_TRUE(kCpuBackends.contains(explain_route(s, c, Pass::backward).chosen)) << s.describe();
    autotune_entries();
    EXPECT_TRUE(unregister_backend("stress_other_device"));
    AttentionArgs bad = c.args();
    bad.dropout_p = 1.0;
    EXPECT_TRUE(test::contains(test::error_message([&] { forward(bad, c.out.view, c.lse.view); }),
                               "dropout_p"));
    ++rounds;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } while (!done.load());
  return rounds;
}

TEST_F(ConcurrencyTest, ThreadsGetTheSingleThreadedResultsAndOneCacheEntryPerKey) {
  const std::vector<StressCase> cases = stress_cases();

  // On one thread: every backend's results, then each case's own call checked against them
  // (autotuning into a folder of its own, so the stress below tunes from nothing).
  use_cache_folder("single-thread");
  std::vector<Expected> expected;
  std::set<std::string> tune_keys;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    expected.push_back(expected_results(cases[i], i));
    tune_keys.insert(expected[i].tune_keys.begin(), expected[i].tune_keys.end());
    run_and_check(cases[i], i, expected[i], "single thread");
  }
  ASSERT_FALSE(::testing::Test::HasFailure()) << "the single-threaded calls disagree already";
  ASSERT_EQ(tune_keys.size(), 10u);  // 5 autotuned problems (one shared by two cases), 2 passes

  const fs::path cache_dir = use_cache_folder("stress");
  std::atomic<bool> done{false};
  int churn_rounds = 0;
  std::thread churner([&] { churn_rounds = churn(cases, done); });
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937 rng(static_cast<unsigned>(w));
      std::vector<std::size_t> order(cases.size());
      std::iota(order.begin(), order.end(), std::size_t{0});
      for (int round = 0; round < kRounds; ++round) {
        std::shuffle(order.begin(), order.end(), rng);
        for (const std::size_t i : order) {
          const std::string where =
              "thread " + std::to_string(w) + " round " + std::to_string(round);
          try {
            run_and_check(cases[i], i, expected[i], where);
          } catch (const std::exception& e) {
            ADD_FAILURE() << where << " " << cases[i].describe() << ": threw " << e.what();
          }
        }
      }
    });
  }
  for (std::thread& t : workers) t.join();
  done = true;
  churner.join();
  EXPECT_GE(churn_rounds, 1);
  std::cerr << "concurrency: " << kWorkers << " threads x " << kRounds << " rounds x "
            << cases.size() << " cases x 2 passes = " << kWorkers * kRounds * cases.size() * 2
            << " calls; " << churn_rounds << " rounds of cache resets beside them" << std::endl;

  // The cache file: one entry per tuned key, each timing both candidates, as memory has them;
  // no temporary file left behind.
  const std::string text = read_text(cache_dir / "autotune.json");
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(doc.is_object() && doc.contains("entries")) << text;
  EXPECT_EQ(doc.value("format", ""), "memeff-autotune");
  std::set<std::string> file_keys;
  for (const auto& [key, entry] : doc["entries"].items()) {
    file_keys.insert(key);
    const std::string quoted = nlohmann::json(key).dump() + ":";
    std::size_t occurrences = 0;
    for (auto at = text.find(quoted); at != std::string::npos; at = text.find(quoted, at + 1)) {
      ++occurrences;
    }
    EXPECT_EQ(occurrences, 1u) << key;
    EXPECT_TRUE(kCpuBackends.contains(entry.value("backend", ""))) << entry.dump();
    std::set<std::string> timed;
    for (const auto& c : entry.value("candidates", nlohmann::json::array())) {
      timed.insert(c.value("backend", ""));
    }
    EXPECT_EQ(timed, kCpuBackends) << entry.dump();
  }
  EXPECT_EQ(file_keys, tune_keys);
  std::map<std::string, std::string> in_memory;
  for (const TuneEntry& t : autotune_entries()) in_memory[t.key] = t.backend;
  std::map<std::string, std::string> in_file;
  for (const auto& [key, entry] : doc["entries"].items()) in_file[key] = entry.value("backend", "");
  EXPECT_EQ(in_memory, in_file);
  for (const auto& f : fs::directory_iterator(cache_dir)) {
    EXPECT_EQ(f.path().filename().string().find(".tmp."), std::string::npos) << f.path();
  }

  // Afterwards this thread's remembered decisions agree with the dispatcher's explanation, and a
  // tuned case runs on the winner in the file.
  for (std::size_t i = 0; i < cases.size(); ++i) {
    Case c(cases[i].cfg, data_seed(i));
    const Explanation ex = explain_route(cases[i], c, Pass::forward);
    EXPECT_EQ(run_pass(cases[i], c, Pass::forward).backend, ex.chosen) << cases[i].describe();
    if (cases[i].autotune) {
      EXPECT_EQ(ex.chosen, in_file[ex.key]) << cases[i].describe();
    }
  }
}

}  // namespace
}  // namespace memeff
