// The NCCL id file of `memeff run --context-parallel` (tools/cli_rendezvous.h), without NCCL: the
// record format refuses every truncation and corruption; rank 0 writes mode 0600 whatever the
// umask, and only in a directory no one else can write; a stale file (old, another run's
// leftover, an exited writer, not private, garbage) is waited past by the readers and replaced by
// rank 0; a live file of another run or another world size is an error naming the path; reader
// and writer threads hand the id over. Every test works in a private temporary directory.
#include "cli_rendezvous.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "memeff/error.h"

namespace memeff::cli {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::system_clock;

// A directory of this test's own, mode 0700 unless a test changes it; removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string name = (std::filesystem::temp_directory_path() / "memeff-rdv-test-XXXXXX").string();
    if (!::mkdtemp(name.data())) throw std::runtime_error("mkdtemp failed");
    path_ = name;
  }
  ~TempDir() {
    ::chmod(path_.c_str(), 0700);
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::size_t entries() const {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path_)) ++n;
    return n;
  }

 private:
  std::string path_;
};

std::vector<std::uint8_t> test_id(int salt) {
  std::vector<std::uint8_t> id(128);  // sizeof(ncclUniqueId)
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::uint8_t>(i * 37 + salt);
  return id;
}

RendezvousRank rank_of(const std::string& token, int world,
                       Clock::time_point started = Clock::now()) {
  return {token, world, started, this_host(), static_cast<std::int64_t>(::getpid())};
}

std::int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

IdRecord record_of(const std::string& token, int world, Clock::time_point created, int salt) {
  IdRecord r;
  r.world = world;
  r.created_ns = ns_of(created);
  r.pid = ::getpid();  // a live writer on this host
  r.host = this_host();
  r.token = token;
  r.id = test_id(salt);
  return r;
}

// Puts `bytes` at `path` with `mode`, as a file left there by someone else would be.
void plant(const std::string& path, const std::vector<std::uint8_t>& bytes, mode_t mode = 0600) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::fchmod(fd, mode), 0);
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

// The memeff::Error `call` throws (code and message); fails the test if it throws none.
std::optional<Error> error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no memeff::Error thrown";
  return std::nullopt;
}

void expect_mentions(const std::optional<Error>& e, const std::vector<std::string>& parts) {
  ASSERT_TRUE(e.has_value());
  const std::string message = e->what();
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "`" << part << "` not in: " << message;
}

// A thread whose exception (a failed await or publish) is rethrown by join(), in the test.
class TestThread {
 public:
  explicit TestThread(std::function<void()> body)
      : thread_([this, body = std::move(body)] {
          try {
            body();
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  ~TestThread() {
    if (thread_.joinable()) thread_.join();  // a test that failed before its join()
  }
  void join() {
    thread_.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
  std::thread thread_;
};

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(IdRecord, RoundTripsAndRefusesEveryTruncationAndCorruption) {
  const IdRecord r = record_of("MASTER_PORT=29500", 8, Clock::now(), 3);
  const std::vector<std::uint8_t> bytes = encode_id_record(r);
  std::string why;
  const std::optional<IdRecord> back = decode_id_record(bytes, &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->world, 8);
  EXPECT_EQ(back->created_ns, r.created_ns);
  EXPECT_EQ(back->pid, r.pid);
  EXPECT_EQ(back->host, r.host);
  EXPECT_EQ(back->token, r.token);
  EXPECT_EQ(back->id, r.id);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(decode_id_record(std::span(bytes).first(n), &why)) << "first " << n << " bytes";
    EXPECT_FALSE(why.empty());
  }
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    std::vector<std::uint8_t> flipped = bytes;
    flipped[i] ^= 0x10;
    EXPECT_FALSE(decode_id_record(flipped, &why)) << "byte " << i << " flipped";
  }
  std::vector<std::uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_FALSE(decode_id_record(longer, &why));
  const std::string text = "this is not an id file at all, just some text of some length";
  EXPECT_FALSE(decode_id_record(std::vector<std::uint8_t>(text.begin(), text.end()), &why));
  EXPECT_NE(why.find("not a memeff NCCL id file"), std::string::npos) << why;
}

TEST(IdFile, IsWrittenWithMode0600WhateverTheUmask) {
  for (const mode_t mask : {0000, 0022, 0077, 0277}) {
    TempDir dir;
    const std::string path = dir.file("id");
    const mode_t old = ::umask(mask);
    const PublishedId published = publish_nccl_id(path, test_id(1), rank_of("t", 2));
    ::umask(old);
    EXPECT_EQ(mode_of(path), 0600u) << "umask " << std::oct << mask;
    EXPECT_TRUE(published.replaced.empty());
    EXPECT_EQ(dir.entries(), 1u) << "the temporary name is gone";
    const IdFileInspection found = inspect_id_file(path, rank_of("t", 2, Clock::now() - 1s));
    EXPECT_EQ(found.state, IdFileState::this_run) << found.what;
    ASSERT_TRUE(found.record);
    EXPECT_EQ(found.record->id, test_id(1));
  }
}

TEST(IdFile, RefusesADirectoryOthersCanWriteOrThatIsNotThere) {
  TempDir dir;
  const std::string path = dir.file("id");
  EXPECT_NO_THROW(check_id_directory(path));
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);  // others may read: still only we write
  EXPECT_NO_THROW(check_id_directory(path));
  struct Case {
    mode_t mode;
    const char* says;
  };
  for (const Case c : {Case{0770, "writable by its group (mode 0770)"},
                       Case{0707, "writable by others (mode 0707)"},
                       Case{01777, "writable by others (mode 1777)"}}) {
    ASSERT_EQ(::chmod(dir.path().c_str(), c.mode), 0);
    const std::vector<std::string> parts = {
        "--nccl-id-file `" + path + "`", "the directory `" + dir.path() + "`", c.says, "mktemp -d"};
    const auto e = error_of([&] { publish_nccl_id(path, test_id(1), rank_of("", 2)); });
    expect_mentions(e, parts);
    EXPECT_EQ(e->code(), ErrorCode::invalid_argument);
    const auto start = std::chrono::steady_clock::now();
    expect_mentions(error_of([&] { await_nccl_id(path, rank_of("", 2), 1, 10s); }), parts);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s)
        << "refused at once, not at the deadline";
    EXPECT_FALSE(std::filesystem::exists(path));
  }
  ASSERT_EQ(::chmod(dir.path().c_str(), 0700), 0);
  expect_mentions(error_of([&] { check_id_directory(dir.file("absent/id")); }),
                  {"--nccl-id-file", "absent", "cannot be used", "mktemp -d"});
  plant(dir.file("plain"), {1, 2, 3});
  expect_mentions(error_of([&] { check_id_directory(dir.file("plain/id")); }),
                  {"is not a directory"});
}

TEST(IdFile, ReaderWithNoFileSaysSoAtTheDeadline) {
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const auto e = error_of([&] { await_nccl_id(dir.file("id"), rank_of("", 2), 3, 120ms); });
  EXPECT_GE(std::chrono::steady_clock::now() - start, 120ms);
  expect_mentions(e, {"--nccl-id-file `" + dir.file("id") + "`", "rank 3 waited 0.12 s",
                      "no file appeared there", "Is rank 0 running", "no run token"});
  EXPECT_EQ(e->code(), ErrorCode::io_error);
}

TEST(IdFile, ReaderRefusesAFileOthersMayReadAndRankZeroReplacesIt) {
  TempDir dir;
  const std::string path = dir.file("id");
  const auto started = Clock::now() - 1s;
  plant(path, encode_id_record(record_of("t", 2, Clock::now(), 4)), 0644);
  const auto e = error_of([&] { await_nccl_id(path, rank_of("t", 2, started), 1, 150ms); });
  expect_mentions(e, {"--nccl-id-file `" + path + "`", "rank 1 waited", "stale", "mode 0644",
                      "did not replace it"});
  EXPECT_EQ(e->code(), ErrorCode::io_error);
  const PublishedId published = publish_nccl_id(path, test_id(5), rank_of("t", 2, started));
  EXPECT_NE(published.replaced.find("mode 0644"), std::string::npos) << published.replaced;
  EXPECT_EQ(mode_of(path), 0600u);
  EXPECT_EQ(await_nccl_id(path, rank_of("t", 2, started), 1, 1s), test_id(5));
}

TEST(IdFile, OldFileIsStaleAndAFreshOneIsAccepted) {
  TempDir dir;
  const std::string path = dir.file("id");
  const auto now = Clock::now();
  plant(path, encode_id_record(record_of("t", 3, now - 1h, 6)));
  // Just inside the slack it is this run's (a rank may start a little after rank 0 wrote).
  EXPECT_EQ(inspect_id_file(path, rank_of("t", 3, now - 1h + kIdFileSlack - 1s)).state,
            IdFileState::this_run);
  const RendezvousRank reader = rank_of("t", 3, now);
  const IdFileInspection found = inspect_id_file(path, reader);
  EXPECT_EQ(found.state, IdFileState::stale);
  expect_mentions(error_of([&] { await_nccl_id(path, reader, 2, 200ms); }),
                  {"--nccl-id-file `" + path + "`", "the file there is stale", "UTC",
                   "3600 s before this rank started", "did not replace it"});

  std::vector<std::uint8_t> got;
  TestThread waiting([&] { got = await_nccl_id(path, reader, 2, 10s); });
  std::this_thread::sleep_for(100ms);
  const PublishedId published = publish_nccl_id(path, test_id(7), rank_of("t", 3, now));
  waiting.join();
  EXPECT_EQ(got, test_id(7));
  EXPECT_NE(published.replaced.find("before this rank started"), std::string::npos)
      << published.replaced;
}

TEST(IdFile, AnotherRunsLeftoverIsStaleButItsLiveFileIsACollision) {
  TempDir dir;
  const std::string path = dir.file("id");
  const auto started = Clock::now();
  const RendezvousRank me = rank_of("MASTER_PORT=29500", 2, started);
  plant(path, encode_id_record(record_of("MASTER_PORT=29501", 2, started - 1s, 8)));
  expect_mentions(error_of([&] { await_nccl_id(path, me, 1, 150ms); }),
                  {"stale", "run token `MASTER_PORT=29501`", "before this rank started"});
  EXPECT_FALSE(publish_nccl_id(path, test_id(9), me).replaced.empty());
  EXPECT_EQ(await_nccl_id(path, me, 1, 1s), test_id(9));

  // Written after this rank started, by a live process: a run sharing the path, now.
  const std::vector<std::uint8_t> theirs =
      encode_id_record(record_of("MASTER_PORT=29501", 2, started + 1s, 10));
  plant(path, theirs);
  const auto start = std::chrono::steady_clock::now();
  const auto e = error_of([&] { await_nccl_id(path, me, 1, 10s); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "an error at once, not a wait";
  expect_mentions(e, {"--nccl-id-file `" + path + "`", "live NCCL id of another run",
                      "run token `MASTER_PORT=29501`", "run token `MASTER_PORT=29500`",
                      "its own --nccl-id-file"});
  EXPECT_EQ(e->code(), ErrorCode::invalid_argument);
  expect_mentions(error_of([&] { publish_nccl_id(path, test_id(11), me); }),
                  {"--nccl-id-file `" + path + "`", "another run", "Rank 0 does not replace it"});
  EXPECT_EQ(inspect_id_file(path, me).record->id, test_id(10)) << "the other run's file is kept";
  EXPECT_EQ(dir.entries(), 1u);
}

TEST(IdFile, WorldSizeMismatchIsAnErrorNamingBoth) {
  TempDir dir;
  const std::string path = dir.file("id");
  const auto started = Clock::now() - 1s;
  plant(path, encode_id_record(record_of("t", 4, Clock::now(), 12)));
  const auto e = error_of([&] { await_nccl_id(path, rank_of("t", 2, started), 1, 10s); });
  expect_mentions(e, {"--nccl-id-file `" + path + "`", "WORLD_SIZE=4", "WORLD_SIZE=2"});
  EXPECT_EQ(e->code(), ErrorCode::invalid_argument);
}

TEST(IdFile, GarbageOrTruncatedFileIsNeverAccepted) {
  TempDir dir;
  const std::string path = dir.file("id");
  const auto started = Clock::now() - 1s;
  const RendezvousRank me = rank_of("t", 2, started);
  const std::vector<std::uint8_t> good = encode_id_record(record_of("t", 2, Clock::now(), 13));
  std::vector<std::uint8_t> flipped = good;
  flipped.back() ^= 1;
  std::vector<std::uint8_t> raw_id = test_id(13);  // the old format: the bare 128 bytes
  const std::vector<std::vector<std::uint8_t>> bad = {
      {}, raw_id, std::vector<std::uint8_t>(good.begin(), good.begin() + good.size() / 2), flipped};
  for (const auto& bytes : bad) {
    plant(path, bytes);
    EXPECT_EQ(inspect_id_file(path, me).state, IdFileState::stale) << bytes.size() << " bytes";
    expect_mentions(error_of([&] { await_nccl_id(path, me, 1, 100ms); }), {"stale"});
    const PublishedId published = publish_nccl_id(path, test_id(14), me);
    EXPECT_FALSE(published.replaced.empty());
    EXPECT_EQ(await_nccl_id(path, me, 1, 1s), test_id(14));
    ::unlink(path.c_str());
  }
}

TEST(IdFile, FileOfAnExitedWriterOnThisHostIsStale) {
  TempDir dir;
  const std::string path = dir.file("id");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  const auto started = Clock::now() - 1s;
  IdRecord r = record_of("t", 2, Clock::now(), 15);
  r.pid = child;
  plant(path, encode_id_record(r));
  const IdFileInspection found = inspect_id_file(path, rank_of("t", 2, started));
  EXPECT_EQ(found.state, IdFileState::stale);
  EXPECT_NE(found.what.find("its writer has exited"), std::string::npos) << found.what;
  // On another host the pid says nothing: the file is this run's.
  r.host = this_host() + "-elsewhere";
  plant(path, encode_id_record(r));
  EXPECT_EQ(inspect_id_file(path, rank_of("t", 2, started)).state, IdFileState::this_run);
}

TEST(IdFile, ReaderAndWriterThreadsHandOverTheId) {
  TempDir dir;
  const std::string path = dir.file("id");
  const auto started = Clock::now();
  constexpr int kWorld = 4;
  std::vector<std::vector<std::uint8_t>> got(kWorld);
  std::vector<std::unique_ptr<TestThread>> readers;
  for (int r = 1; r < kWorld; ++r) {
    readers.push_back(std::make_unique<TestThread>(
        [&, r] { got[r] = await_nccl_id(path, rank_of("tok", kWorld, started), r, 10s); }));
  }
  PublishedId published;
  TestThread writer([&] {
    std::this_thread::sleep_for(50ms);
    published = publish_nccl_id(path, test_id(16), rank_of("tok", kWorld, started));
  });
  writer.join();
  for (auto& t : readers) t->join();
  for (int r = 1; r < kWorld; ++r) EXPECT_EQ(got[r], test_id(16)) << "rank " << r;
  EXPECT_TRUE(published.replaced.empty());
  // A second rank 0 of the same run is refused, and leaves the file alone.
  expect_mentions(error_of([&] { publish_nccl_id(path, test_id(17), rank_of("tok", kWorld)); }),
                  {"--nccl-id-file `" + path + "`", "already holds a live NCCL id of this run"});
  retract_nccl_id(path, published);
  EXPECT_FALSE(std::filesystem::exists(path));
  // retract removes only the file it wrote.
  const PublishedId again = publish_nccl_id(path, test_id(18), rank_of("tok", kWorld, started));
  plant(path, encode_id_record(record_of("tok", kWorld, Clock::now(), 19)));
  retract_nccl_id(path, again);
  EXPECT_TRUE(std::filesystem::exists(path));
}

TEST(IdFile, RunTokenComesFromTheLaunchersVariables) {
  const char* names[] = {"MEMEFF_RUN_TOKEN", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
                         "TORCHELASTIC_RESTART_COUNT"};
  std::vector<std::optional<std::string>> saved;
  for (const char* n : names) {
    const char* v = std::getenv(n);
    saved.push_back(v ? std::optional<std::string>(v) : std::nullopt);
    ::unsetenv(n);
  }
  EXPECT_EQ(run_token_from_environment(), "");
  ::setenv("MASTER_ADDR", "10.0.0.1", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  ::setenv("TORCHELASTIC_RESTART_COUNT", "0", 1);
  EXPECT_EQ(run_token_from_environment(),
            "MASTER_ADDR=10.0.0.1;MASTER_PORT=29500;TORCHELASTIC_RESTART_COUNT=0");
  ::setenv("TORCHELASTIC_RESTART_COUNT", "1", 1);  // a restarted attempt is another run
  const std::string restarted = run_token_from_environment();
  EXPECT_NE(restarted.find("TORCHELASTIC_RESTART_COUNT=1"), std::string::npos);
  ::setenv("MEMEFF_RUN_TOKEN", "job-42", 1);
  EXPECT_EQ(run_token_from_environment().rfind("MEMEFF_RUN_TOKEN=job-42;", 0), 0u);
  EXPECT_EQ(this_rank(3).token, run_token_from_environment());
  EXPECT_EQ(this_rank(3).world, 3);
  for (std::size_t i = 0; i < saved.size(); ++i) {
    if (saved[i]) {
      ::setenv(names[i], saved[i]->c_str(), 1);
    } else {
      ::unsetenv(names[i]);
    }
  }
}

}  // namespace
}  // namespace memeff::cli
