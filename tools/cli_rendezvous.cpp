// The NCCL id file of `memeff run --context-parallel` (see cli_rendezvous.h): its record format,
// the private-directory rule, and rank 0's write and the other ranks' wait.
#include "cli_rendezvous.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <thread>

#include "memeff/error.h"

namespace memeff::cli {
namespace {

constexpr char kMagic[8] = {'M', 'E', 'M', 'E', 'F', 'F', 'I', 'D'};
constexpr std::uint32_t kVersion = 1;
// magic, version, world, created, pid, three lengths; then the strings, the id, the checksum.
constexpr std::size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8 + 4 + 4 + 4;
constexpr std::size_t kChecksumBytes = 8;
constexpr std::size_t kMaxHostBytes = 256, kMaxTokenBytes = 4096, kMaxIdBytes = 4096;
constexpr std::size_t kMaxFileBytes =
    kHeaderBytes + kMaxHostBytes + kMaxTokenBytes + kMaxIdBytes + kChecksumBytes;
constexpr auto kPoll = std::chrono::milliseconds(25);
constexpr auto kProgressEvery = std::chrono::seconds(15);

const char* const kPrivateDirectoryHint =
    "the NCCL id must live in a directory only you can write: point --nccl-id-file (or "
    "MEMEFF_NCCL_ID_FILE) into a private directory, e.g. one made with `mktemp -d`";

std::uint64_t fnv1a(std::span<const std::uint8_t> bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const std::uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

void put(std::vector<std::uint8_t>& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}

std::uint64_t get(std::span<const std::uint8_t> in, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(in[at + i]) << (8 * i);
  return v;
}

std::int64_t to_ns(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::string utc_text(std::int64_t ns) {
  const std::time_t seconds = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s >= 100 ? "%.0f s" : "%.3g s", s);
  return buf;
}

std::string mode_text(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::string token_text(const std::string& token) {
  return token.empty() ? "no run token" : "run token `" + token + "`";
}

std::string prefix(const std::string& path) { return "--nccl-id-file `" + path + "`: "; }

std::string directory_of(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

bool process_alive(std::int64_t pid) {
  if (pid <= 0 || pid > INT32_MAX) return true;  // not a pid we can ask about: assume alive
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

// The file's bytes, or nullopt with *why when there is none to read (missing: *why empty).
std::optional<std::vector<std::uint8_t>> read_private_file(const std::string& path,
                                                           std::string* why) {
  why->clear();
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    *why = errno == ELOOP ? "a symbolic link"
                          : std::string("cannot be read (") + std::strerror(errno) + ")";
    return std::nullopt;
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *why = std::string("cannot be examined (") + std::strerror(errno) + ")";
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode)) {
    *why = "not a regular file";
    return std::nullopt;
  }
  if (st.st_uid != ::geteuid()) {
    *why = "owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
           std::to_string(::geteuid()) + ")";
    return std::nullopt;
  }
  if ((st.st_mode & 077) != 0) {
    *why = "mode " + mode_text(st.st_mode) +
           ": group or others may read or write it (memeff writes 0600)";
    return std::nullopt;
  }
  std::vector<std::uint8_t> bytes(kMaxFileBytes + 1);
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *why = std::string("cannot be read (") + std::strerror(errno) + ")";
      return std::nullopt;
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  bytes.resize(got);
  return bytes;
}

void write_all(int fd, const std::vector<std::uint8_t>& bytes, const std::string& name) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw Error(ErrorCode::io_error,
                  "--nccl-id-file: cannot write `" + name + "` (" + std::strerror(errno) + ")");
    }
    done += static_cast<std::size_t>(n);
  }
}

[[noreturn]] void throw_collision(const std::string& path, const IdFileInspection& found,
                                  const RendezvousRank& rank, bool writing) {
  std::string message = prefix(path);
  if (found.state == IdFileState::this_run) {  // only rank 0 gets here
    message += "already holds a live NCCL id of this run (" + found.what +
               "): another process of this run has RANK=0, or two runs with the same run token "
               "share the path. ";
  } else if (found.record && found.record->token == rank.token) {
    message += "holds an NCCL id for WORLD_SIZE=" + std::to_string(found.record->world) + " (" +
               found.what + "), and this rank has WORLD_SIZE=" + std::to_string(rank.world) +
               ": the ranks disagree on WORLD_SIZE, or two runs with the same run token share "
               "the path. ";
  } else {
    message += "holds the live NCCL id of another run (" + found.what + "; this rank has " +
               token_text(rank.token) + "). ";
  }
  message += std::string(writing ? "Rank 0 does not replace it. " : "") +
             "Give each run its own --nccl-id-file (e.g. in a directory made with `mktemp -d`), "
             "or remove the file if its run is over";
  throw Error(ErrorCode::invalid_argument, message);
}

}  // namespace

std::string run_token_from_environment() {
  std::string token;
  for (const char* name : {"MEMEFF_RUN_TOKEN", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
                           "TORCHELASTIC_RESTART_COUNT"}) {
    if (const char* value = std::getenv(name)) {
      if (!token.empty()) token += ';';
      token += std::string(name) + "=" + value;
    }
  }
  if (token.size() > kMaxTokenBytes) {
    throw Error(ErrorCode::invalid_argument,
                "the run token (MEMEFF_RUN_TOKEN and the torchrun variables) is " +
                    std::to_string(token.size()) + " bytes; at most " +
                    std::to_string(kMaxTokenBytes));
  }
  return token;
}

std::string this_host() {
  char name[kMaxHostBytes + 1] = {};
  if (::gethostname(name, kMaxHostBytes) != 0) return "";
  return name;
}

RendezvousRank this_rank(int world) {
  return {run_token_from_environment(), world, std::chrono::system_clock::now(), this_host(),
          static_cast<std::int64_t>(::getpid())};
}

std::vector<std::uint8_t> encode_id_record(const IdRecord& r) {
  if (r.host.size() > kMaxHostBytes || r.token.size() > kMaxTokenBytes ||
      r.id.size() > kMaxIdBytes) {
    throw Error(ErrorCode::invalid_argument,
                "NCCL id record: host, token or id longer than the format allows (" +
                    std::to_string(kMaxHostBytes) + ", " + std::to_string(kMaxTokenBytes) + ", " +
                    std::to_string(kMaxIdBytes) + " bytes)");
  }
  std::vector<std::uint8_t> out(kMagic, kMagic + sizeof kMagic);
  put(out, kVersion, 4);
  put(out, static_cast<std::uint32_t>(r.world), 4);
  put(out, static_cast<std::uint64_t>(r.created_ns), 8);
  put(out, static_cast<std::uint64_t>(r.pid), 8);
  put(out, r.host.size(), 4);
  put(out, r.token.size(), 4);
  put(out, r.id.size(), 4);
  out.insert(out.end(), r.host.begin(), r.host.end());
  out.insert(out.end(), r.token.begin(), r.token.end());
  out.insert(out.end(), r.id.begin(), r.id.end());
  put(out, fnv1a(out), 8);
  return out;
}

std::optional<IdRecord> decode_id_record(std::span<const std::uint8_t> in, std::string* why) {
  auto fail = [&](std::string text) {
    *why = std::move(text);
    return std::nullopt;
  };
  const std::string size = std::to_string(in.size()) + " bytes";
  if (in.size() < sizeof kMagic) return fail("truncated (" + size + ")");
  if (!std::equal(kMagic, kMagic + sizeof kMagic, in.begin()))
    return fail("not a memeff NCCL id file (no MEMEFFID header; " + size + ")");
  if (in.size() < kHeaderBytes + kChecksumBytes) return fail("truncated (" + size + ")");
  const std::uint64_t version = get(in, 8, 4);
  if (version != kVersion) {
    return fail("format version " + std::to_string(version) + " (this memeff reads " +
                std::to_string(kVersion) + ")");
  }
  const std::size_t host = get(in, 32, 4), token = get(in, 36, 4), id = get(in, 40, 4);
  if (host > kMaxHostBytes || token > kMaxTokenBytes || id > kMaxIdBytes)
    return fail("corrupt (field lengths out of range)");
  const std::size_t total = kHeaderBytes + host + token + id + kChecksumBytes;
  if (in.size() < total) return fail("truncated (" + size + " of " + std::to_string(total) + ")");
  if (in.size() > total)
    return fail("corrupt (" + size + ", " + std::to_string(total) + " expected)");
  if (get(in, total - kChecksumBytes, 8) != fnv1a(in.first(total - kChecksumBytes)))
    return fail("corrupt (checksum mismatch)");
  IdRecord r;
  r.world = static_cast<int>(get(in, 12, 4));
  if (r.world < 1) return fail("corrupt (world size out of range)");
  r.created_ns = static_cast<std::int64_t>(get(in, 16, 8));
  r.pid = static_cast<std::int64_t>(get(in, 24, 8));
  const auto text = [&](std::size_t at, std::size_t n) {
    return std::string(reinterpret_cast<const char*>(in.data()) + at, n);
  };
  r.host = text(kHeaderBytes, host);
  r.token = text(kHeaderBytes + host, token);
  r.id.assign(in.begin() + static_cast<std::ptrdiff_t>(kHeaderBytes + host + token),
              in.begin() + static_cast<std::ptrdiff_t>(kHeaderBytes + host + token + id));
  return r;
}

void check_id_directory(const std::string& path) {
  if (path.empty()) throw Error(ErrorCode::invalid_argument, "--nccl-id-file: empty path");
  const std::string dir = directory_of(path);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    throw Error(ErrorCode::invalid_argument, prefix(path) + "the directory `" + dir +
                                                 "` cannot be used (" + std::strerror(errno) +
                                                 "); " + kPrivateDirectoryHint);
  }
  std::string problem;
  if (!S_ISDIR(st.st_mode)) {
    problem = "is not a directory";
  } else if (st.st_uid != ::geteuid()) {
    problem = "is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
              std::to_string(::geteuid()) + ")";
  } else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    problem = std::string("is writable by ") + ((st.st_mode & S_IWOTH) ? "others" : "its group") +
              " (mode " + mode_text(st.st_mode) + ")";
  }
  if (!problem.empty()) {
    throw Error(ErrorCode::invalid_argument, prefix(path) + "the directory `" + dir + "` " +
                                                 problem + "; " + kPrivateDirectoryHint);
  }
}

IdFileInspection inspect_id_file(const std::string& path, const RendezvousRank& rank) {
  IdFileInspection found;
  std::string why;
  const std::optional<std::vector<std::uint8_t>> bytes = read_private_file(path, &why);
  if (!bytes) {
    found.state = why.empty() ? IdFileState::missing : IdFileState::stale;
    found.what = why;
    return found;
  }
  found.record = decode_id_record(*bytes, &why);
  if (!found.record) {
    found.state = IdFileState::stale;
    found.what = why;
    return found;
  }
  const IdRecord& r = *found.record;
  const std::int64_t started = to_ns(rank.started);
  found.what = "written " + utc_text(r.created_ns) + " by pid " + std::to_string(r.pid) + " on " +
               (r.host.empty() ? "an unnamed host" : r.host) + ", " + token_text(r.token);
  const bool here = !r.host.empty() && r.host == rank.host;
  if (here && r.pid != rank.pid && !process_alive(r.pid)) {
    found.state = IdFileState::stale;
    found.what += "; its writer has exited";
    return found;
  }
  if (r.token != rank.token) {
    // Another run's file: live if written after this rank started, else left over.
    found.state = r.created_ns >= started ? IdFileState::collision : IdFileState::stale;
    if (found.state == IdFileState::stale) found.what += "; before this rank started";
    return found;
  }
  const std::int64_t slack_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(kIdFileSlack).count();
  if (r.created_ns < started - slack_ns) {
    found.state = IdFileState::stale;
    found.what += "; " + seconds_text(static_cast<double>(started - r.created_ns) * 1e-9) +
                  " before this rank started (more than the " +
                  std::to_string(kIdFileSlack.count()) + " s allowed)";
    return found;
  }
  found.state = r.world == rank.world ? IdFileState::this_run : IdFileState::collision;
  return found;
}

PublishedId publish_nccl_id(const std::string& path, const std::vector<std::uint8_t>& id,
                            const RendezvousRank& rank) {
  check_id_directory(path);
  IdRecord record;
  record.world = rank.world;
  record.created_ns = to_ns(std::chrono::system_clock::now());
  record.pid = rank.pid;
  record.host = rank.host;
  record.token = rank.token;
  record.id = id;
  PublishedId published;
  published.contents = encode_id_record(record);

  std::random_device entropy;
  char suffix[24];
  std::snprintf(suffix, sizeof suffix, "%08x%08x", entropy(), entropy());
  const std::string tmp = path + ".tmp." + std::to_string(rank.pid) + "." + suffix;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error(ErrorCode::io_error,
                prefix(path) + "cannot create " + tmp + " (" + std::strerror(errno) + ")");
  }
  struct TmpFile {
    const std::string& name;
    int fd;
    ~TmpFile() {
      if (fd >= 0) ::close(fd);
      ::unlink(name.c_str());  // linked to `path` or failed: the temporary name goes either way
    }
  } guard{tmp, fd};
  // 0600 whatever the umask (a umask can only remove bits, e.g. leave 0400).
  if (::fchmod(fd, 0600) != 0) {
    throw Error(ErrorCode::io_error, prefix(path) + "cannot set mode 0600 on " + tmp + " (" +
                                         std::strerror(errno) + ")");
  }
  write_all(fd, published.contents, tmp);
  if (::fsync(fd) != 0) {
    throw Error(ErrorCode::io_error,
                prefix(path) + "cannot flush " + tmp + " (" + std::strerror(errno) + ")");
  }
  ::close(fd);
  guard.fd = -1;

  // link() publishes only where no file is: a file there is examined, and replaced only if stale.
  // A filesystem without hard links gets rename() after the same examination.
  for (int attempt = 0; attempt < 16; ++attempt) {
    const bool linked = ::link(tmp.c_str(), path.c_str()) == 0;
    if (linked) return published;
    const int link_errno = errno;
    const bool no_links = link_errno == EPERM || link_errno == EOPNOTSUPP || link_errno == ENOSYS ||
                          link_errno == EMLINK;
    if (link_errno != EEXIST && !no_links) {
      throw Error(ErrorCode::io_error, prefix(path) + "cannot link " + tmp + " to it (" +
                                           std::strerror(link_errno) + ")");
    }
    const IdFileInspection found = inspect_id_file(path, rank);
    if (found.state == IdFileState::collision || found.state == IdFileState::this_run)
      throw_collision(path, found, rank, true);
    if (found.state == IdFileState::stale) published.replaced = found.what;
    if (no_links) {
      if (::rename(tmp.c_str(), path.c_str()) != 0) {
        throw Error(ErrorCode::io_error, prefix(path) + "cannot rename " + tmp + " to it (" +
                                             std::strerror(errno) + ")");
      }
      return published;
    }
    if (found.state == IdFileState::stale && ::unlink(path.c_str()) != 0 && errno != ENOENT) {
      throw Error(ErrorCode::io_error, prefix(path) + "cannot remove the stale file there (" +
                                           found.what + "): " + std::strerror(errno));
    }
  }
  throw Error(ErrorCode::io_error,
              prefix(path) +
                  "another process keeps putting files there; give this run its own "
                  "--nccl-id-file (e.g. in a directory made with `mktemp -d`)");
}

void retract_nccl_id(const std::string& path, const PublishedId& published) {
  std::string why;
  const std::optional<std::vector<std::uint8_t>> bytes = read_private_file(path, &why);
  if (bytes && *bytes == published.contents) ::unlink(path.c_str());
}

std::vector<std::uint8_t> await_nccl_id(const std::string& path, const RendezvousRank& rank,
                                        int rank_index, std::chrono::milliseconds timeout,
                                        const std::function<void(const std::string&)>& progress) {
  check_id_directory(path);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  auto next_progress = start + kProgressEvery;
  IdFileInspection last;
  const std::string who = "rank " + std::to_string(rank_index);
  auto waiting = [&] {
    return last.state == IdFileState::stale ? "the file there is stale: " + last.what
                                            : std::string("no file appeared there");
  };
  for (;;) {
    last = inspect_id_file(path, rank);
    if (last.state == IdFileState::this_run) return last.record->id;
    if (last.state == IdFileState::collision) throw_collision(path, last, rank, false);
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    if (progress && now >= next_progress) {
      const double waited = std::chrono::duration<double>(now - start).count();
      progress(who + " has waited " + seconds_text(waited) +
               " for rank 0 to write the NCCL id to " + path + " (" + waiting() + ")");
      next_progress += kProgressEvery;
    }
    std::this_thread::sleep_for(kPoll);
  }
  const double waited = std::chrono::duration<double>(timeout).count();
  throw Error(ErrorCode::io_error,
              prefix(path) + who + " waited " + seconds_text(waited) +
                  " for rank 0 to write the NCCL unique id; " + waiting() +
                  (last.state == IdFileState::stale ? ", and rank 0 of this run did not replace it"
                                                    : std::string()) +
                  ". Is rank 0 running, with the same --nccl-id-file and the same run token (" +
                  token_text(rank.token) + ")?");
}

}  // namespace memeff::cli
