// Autotuning with fake backends whose times the test controls: the choice follows the timings
// (also against the default order), each shape is timed once, the cache file round-trips,
// corrupt/truncated/foreign/old files are ignored with one warning and rewritten, concurrent
// processes merge their keys, and unwritable locations degrade to in-memory tuning.
#include "core/autotune.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/fake_backend.h"
#include "common/host_tensor.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/dispatch.h"
#include "memeff/error.h"

namespace memeff {
namespace {

namespace fs = std::filesystem;
using test::HostTensor;

// Every pass takes `ms` milliseconds (a sleep); counts its calls.
class TimedBackend final : public test::FakeBackend {
 public:
  TimedBackend(std::string name, double ms) : FakeBackend(std::move(name)), ms_(ms) {}
  DeviceType device_type() const override { return claimed_device; }
  void forward(const Problem& p, const AttentionArgs& a, const TensorView& out,
               const TensorView& lse, const Options& o) override {
    FakeBackend::forward(p, a, out, lse, o);
    wait();
  }
  void backward(const Problem& p, const AttentionArgs& a, const BackwardTensors& g,
                const Options& o) override {
    FakeBackend::backward(p, a, g, o);
    wait();
  }
  // With claimed_device cuda: own_timer stands for a device timer (a host clock here, as the fake
  // finishes its work before returning); without it the default Backend::time_ms applies.
  double time_ms(const Problem& p, const Options& o, const std::function<void()>& run) override {
    if (!own_timer) return Backend::time_ms(p, o, run);
    const auto t0 = std::chrono::steady_clock::now();
    run();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  DeviceType claimed_device = DeviceType::cpu;
  bool own_timer = false;

 private:
  void wait() const {
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(ms_ * 1000)));
  }
  double ms_;
};

struct Call {
  HostTensor q, k, v, out, lse;
  explicit Call(std::int64_t Lq)
      : q(DType::f32, {1, 2, Lq, 8}),
        k(DType::f32, {1, 2, 6, 8}),
        v(DType::f32, {1, 2, 6, 8}),
        out(DType::f32, {1, 2, Lq, 8}),
        lse(DType::f32, {1, 2, Lq}) {}
  AttentionArgs args() const { return test::attention_args(q, k, v); }
  CallInfo run(const Options& o) const { return forward(args(), out.view, lse.view, o); }
  // The same views, labelled as cuda:0 memory (fake backends never read them).
  Call& on_cuda() {
    for (HostTensor* t : {&q, &k, &v, &out, &lse}) t->view.device = Device::cuda(0);
    return *this;
  }
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// The document, or a discarded value when `text` is not JSON.
nlohmann::json parse_json(const std::string& text) {
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

class AutotuneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/memeff-autotune-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = root = tmpl;
    setenv("MEMEFF_CACHE_DIR", dir.c_str(), 1);
    unsetenv("MEMEFF_AUTOTUNE");
    unsetenv("MEMEFF_BACKENDS");
    autotune_reset_memory();
    slow = add("fake_slow", 6.0);
    fast = add("fake_fast", 1.0);
  }
  void TearDown() override {
    for (const std::string& n : added) unregister_backend(n);
    for (auto& [name, original] : replaced) {
      if (original) register_backend(original);
    }
    unsetenv("MEMEFF_CACHE_DIR");
    unsetenv("MEMEFF_AUTOTUNE");
    autotune_reset_memory();
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  std::shared_ptr<TimedBackend> add(const std::string& name, double ms) {
    auto b = std::make_shared<TimedBackend>(name, ms);
    register_backend(b);
    added.push_back(name);
    return b;
  }
  // Puts a fake under a built-in's name (restored in TearDown).
  std::shared_ptr<TimedBackend> replace(const std::string& name, double ms) {
    replaced.emplace_back(name, find_backend(name));
    auto b = std::make_shared<TimedBackend>(name, ms);
    register_backend(b);
    added.push_back(name);
    return b;
  }
  Options tuned(std::vector<std::string> order) const {
    Options o;
    o.backends = std::move(order);
    o.autotune = true;
    return o;
  }
  fs::path cache() const { return fs::path(dir) / "autotune.json"; }

  std::string root, dir;  // the test's temporary folder; the cache folder in use (inside it)
  std::shared_ptr<TimedBackend> slow, fast;
  std::vector<std::string> added;
  std::vector<std::pair<std::string, std::shared_ptr<Backend>>> replaced;
};

constexpr int kTimedRuns = detail::kAutotuneWarmups + detail::kAutotuneRepeats;

TEST_F(AutotuneTest, ChoiceFollowsTheTimingsAndEachShapeIsTimedOnce) {
  Call c(4);
  const Explanation before = explain(c.args(), Pass::forward, tuned({"fake_slow", "fake_fast"}));
  EXPECT_EQ(before.chosen, "fake_slow");  // not measured yet: the order decides for now
  EXPECT_TRUE(before.autotune);
  EXPECT_NE(before.reason.find("autotune is on"), std::string::npos) << before.reason;

  EXPECT_EQ(c.run(tuned({"fake_slow", "fake_fast"})).backend, "fake_fast");
  EXPECT_EQ(fast->forward_calls, kTimedRuns + 1);  // timed, then the real call
  EXPECT_GE(slow->forward_calls, detail::kAutotuneWarmups);
  const int slow_calls = slow->forward_calls;

  EXPECT_EQ(c.run(tuned({"fake_slow", "fake_fast"})).backend, "fake_fast");
  EXPECT_EQ(fast->forward_calls, kTimedRuns + 2);  // remembered: no second tune
  EXPECT_EQ(slow->forward_calls, slow_calls);

  const Explanation after = explain(c.args(), Pass::forward, tuned({"fake_slow", "fake_fast"}));
  EXPECT_EQ(after.chosen, "fake_fast");
  EXPECT_NE(after.reason.find("autotune result (remembered)"), std::string::npos) << after.reason;
  ASSERT_EQ(after.timings.size(), 2u);
  EXPECT_EQ(after.timings[0].backend, "fake_fast");
  EXPECT_GT(after.timings[1].ms, after.timings[0].ms * 2);

  // Without autotune the order decides again; the backward is a key of its own.
  Options plain;
  plain.backends = {"fake_slow", "fake_fast"};
  EXPECT_EQ(c.run(plain).backend, "fake_slow");
  EXPECT_EQ(explain(c.args(), Pass::backward, tuned({"fake_slow", "fake_fast"})).chosen,
            "fake_slow");
}

TEST_F(AutotuneTest, TheFastestWinsAlsoWhenItIsLaterInTheDefaultOrder) {
  auto cpu = replace("cpu", 6.0);
  auto reference = replace("reference", 1.0);
  unregister_backend("fake_slow");
  unregister_backend("fake_fast");
  Call c(5);
  EXPECT_EQ(c.run(Options{}).backend, "cpu");  // default order: cpu first
  setenv("MEMEFF_AUTOTUNE", "1", 1);
  EXPECT_EQ(c.run(Options{}).backend, "reference");
  const Explanation ex = explain(c.args(), Pass::forward);
  EXPECT_EQ(ex.order_source, "default");
  EXPECT_EQ(ex.chosen, "reference");
  Options off;
  off.autotune = false;  // the option beats the environment
  EXPECT_EQ(c.run(off).backend, "cpu");
}

TEST_F(AutotuneTest, TheCacheRoundTripsAcrossResetMemory) {
  Call c(6);
  EXPECT_EQ(c.run(tuned({"fake_slow", "fake_fast"})).backend, "fake_fast");
  ASSERT_TRUE(fs::exists(cache())) << autotune_cache_path();
  EXPECT_EQ(autotune_cache_path(), cache().string());
  const auto doc = parse_json(read_text(cache()));
  ASSERT_FALSE(doc.is_discarded());
  EXPECT_EQ(doc.at("format"), "memeff-autotune");
  EXPECT_EQ(doc.at("library_version"), version());
  ASSERT_EQ(doc.at("entries").size(), 1u);
  const std::string key = doc.at("entries").begin().key();
  EXPECT_NE(key.find("lq=6"), std::string::npos) << key;
  EXPECT_NE(key.find("pass=forward"), std::string::npos) << key;
  EXPECT_NE(key.find(detail::device_label(Device::cpu())), std::string::npos) << key;

  autotune_reset_memory();
  const int fast_calls = fast->forward_calls, slow_calls = slow->forward_calls;
  const std::vector<TuneEntry> entries = autotune_entries();  // loads the file
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].backend, "fake_fast");
  EXPECT_EQ(entries[0].key, key);
  EXPECT_EQ(entries[0].candidates.size(), 2u);
  autotune_reset_memory();
  EXPECT_EQ(c.run(tuned({"fake_slow", "fake_fast"})).backend, "fake_fast");
  EXPECT_EQ(fast->forward_calls, fast_calls + 1);  // from the file, not timed again
  EXPECT_EQ(slow->forward_calls, slow_calls);
}

// Each bad file: one warning, the right choice, and a valid file afterwards.
TEST_F(AutotuneTest, BadCacheFilesAreIgnoredWithOneWarningAndRewritten) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"truncated", "{\"format\":\"memeff-autotune\",\"format_version\":1,\"entr"},
      {"garbage", "\x01\x02 not json at all"},
      {"foreign", "{\"format\":\"someone-else\",\"entries\":{}}"},
      {"old version",
       "{\"format\":\"memeff-autotune\",\"format_version\":1,\"library_version\":\"0.0.0-old\","
       "\"entries\":{}}"},
      {"wrong entry", std::string("{\"format\":\"memeff-autotune\",\"format_version\":1,"
                                  "\"library_version\":\"") +
                          version() + "\",\"entries\":{\"k\":{\"backend\":3}}}"},
      {"empty", ""},
  };
  std::int64_t lq = 10;
  for (const auto& [what, text] : bad) {
    SCOPED_TRACE(what);
    { std::ofstream(cache(), std::ios::trunc) << text; }
    autotune_reset_memory();
    ::testing::internal::CaptureStderr();
    Call c(lq);
    EXPECT_EQ(c.run(tuned({"fake_slow", "fake_fast"})).backend, "fake_fast");
    Call c2(lq + 1);
    EXPECT_EQ(c2.run(tuned({"fake_slow", "fake_fast"})).backend, "fake_fast");
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(count(err, "ignoring the autotune cache"), 1u) << err;
    const auto doc = parse_json(read_text(cache()));
    ASSERT_FALSE(doc.is_discarded()) << read_text(cache());
    EXPECT_EQ(doc.at("library_version"), version());
    EXPECT_EQ(doc.at("entries").size(), 2u);
    // Remove the good file so the next case starts from its own bad one, under a new path.
    dir += "/next";
    fs::create_directories(dir);
    setenv("MEMEFF_CACHE_DIR", dir.c_str(), 1);
    lq += 2;
  }
}

TEST_F(AutotuneTest, ConcurrentProcessesMergeTheirKeys) {
  constexpr int kProcesses = 4, kKeysEach = 4;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int bad = 0;
      for (int k = 0; k < kKeysEach; ++k) {
        Call c(100 + p * kKeysEach + k);
        try {
          if (c.run(tuned({"fake_slow", "fake_fast"})).backend != "fake_fast") ++bad;
        } catch (...) {
          ++bad;
        }
      }
      _exit(bad);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  const auto doc = parse_json(read_text(cache()));
  ASSERT_FALSE(doc.is_discarded()) << read_text(cache());
  EXPECT_EQ(doc.at("entries").size(), static_cast<std::size_t>(kProcesses * kKeysEach));
  autotune_reset_memory();
  std::size_t found = 0;
  for (const TuneEntry& e : autotune_entries()) {
    for (int lq = 100; lq < 100 + kProcesses * kKeysEach; ++lq) {
      if (e.key.find("|lq=" + std::to_string(lq) + "|") != std::string::npos) ++found;
    }
    EXPECT_EQ(e.backend, "fake_fast") << e.key;
  }
  EXPECT_EQ(found, static_cast<std::size_t>(kProcesses * kKeysEach));
  for (const auto& entry : fs::directory_iterator(dir)) {  // no temporary file left behind
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
  }
}

TEST_F(AutotuneTest, ThreadsTuningAtOnceAgreeWithTheFile) {
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      Call c(200 + t);
      if (c.run(tuned({"fake_slow", "fake_fast"})).backend != "fake_fast") ++wrong;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong, 0);
  const auto doc = parse_json(read_text(cache()));
  ASSERT_FALSE(doc.is_discarded());
  EXPECT_EQ(doc.at("entries").size(), 3u);
}

TEST_F(AutotuneTest, AnUnwritableLocationDegradesToMemory) {
  const fs::path file = fs::path(dir) / "a-file";
  { std::ofstream(file) << "x"; }
  const std::string bad_dir = (file / "sub").string();  // below a regular file: never creatable
  setenv("MEMEFF_CACHE_DIR", bad_dir.c_str(), 1);
  autotune_reset_memory();
  ::testing::internal::CaptureStderr();
  Call a(20), b(21);
  EXPECT_EQ(a.run(tuned({"fake_slow", "fake_fast"})).backend, "fake_fast");
  EXPECT_EQ(b.run(tuned({"fake_slow", "fake_fast"})).backend, "fake_fast");
  const int fast_calls = fast->forward_calls;
  EXPECT_EQ(a.run(tuned({"fake_slow", "fake_fast"})).backend, "fake_fast");
  EXPECT_EQ(fast->forward_calls, fast_calls + 1);  // remembered in memory
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "cannot write the autotune cache"), 1u) << err;
  EXPECT_NE(err.find("stay in memory"), std::string::npos) << err;
  EXPECT_EQ(autotune_entries().size(), 2u);
}

TEST_F(AutotuneTest, ACacheThatIsADirectoryIsUnreadableAndDegrades) {
  fs::create_directories(cache());
  ::testing::internal::CaptureStderr();
  Call c(30);
  EXPECT_EQ(c.run(tuned({"fake_slow", "fake_fast"})).backend, "fake_fast");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "ignoring the autotune cache"), 1u) << err;
  EXPECT_EQ(count(err, "cannot write the autotune cache"), 1u) << err;
  EXPECT_EQ(autotune_entries().size(), 1u);
}

TEST_F(AutotuneTest, CachePathFollowsTheEnvironment) {
  EXPECT_EQ(autotune_cache_path(), cache().string());
  unsetenv("MEMEFF_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/some/xdg", 1);
  EXPECT_EQ(autotune_cache_path(), "/some/xdg/memeff/autotune.json");
  unsetenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (home) {
    EXPECT_EQ(autotune_cache_path(), std::string(home) + "/.cache/memeff/autotune.json");
  }
  setenv("MEMEFF_CACHE_DIR", dir.c_str(), 1);
}

// nlohmann/json parses nesting with its own stack, not the call stack: a hostile cache file
// is one more unusable file, not a crash.
TEST_F(AutotuneTest, ADeeplyNestedCacheIsIgnoredWithoutCrashing) {
  constexpr std::size_t kDepth = 200000;
  {
    std::ofstream(cache(), std::ios::trunc) << std::string(kDepth, '[') << std::string(kDepth, ']');
  }
  autotune_reset_memory();
  ::testing::internal::CaptureStderr();
  Call c(40);
  EXPECT_EQ(c.run(tuned({"fake_slow", "fake_fast"})).backend, "fake_fast");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "ignoring the autotune cache"), 1u) << err;
  const auto doc = parse_json(read_text(cache()));
  ASSERT_FALSE(doc.is_discarded());
  EXPECT_EQ(doc.at("entries").size(), 1u);
}

// Backend::time_ms's default reads the host clock, which would time only the launches of a
// device backend: such a backend fails its timing (and loses) instead of winning on a wrong time.
TEST_F(AutotuneTest, ADeviceBackendWithoutItsOwnTimerIsNotTimedByTheHostClock) {
  auto untimed = add("fake_gpu_untimed", 0.0);  // the fastest, if it were host-timed
  auto timed = add("fake_gpu_timed", 3.0);
  untimed->claimed_device = timed->claimed_device = DeviceType::cuda;
  timed->own_timer = true;
  Call c(50);
  c.on_cuda();
  const Options o = tuned({"fake_gpu_untimed", "fake_gpu_timed"});
  EXPECT_EQ(c.run(o).backend, "fake_gpu_timed");
  EXPECT_EQ(untimed->forward_calls, 0);
  const Explanation ex = explain(c.args(), Pass::forward, o);
  ASSERT_EQ(ex.timings.size(), 1u) << ex.reason;
  EXPECT_EQ(ex.timings[0].backend, "fake_gpu_timed");
  EXPECT_NE(ex.key.find("cuda:0"), std::string::npos) << ex.key;  // the default device label
}

}  // namespace
}  // namespace memeff
