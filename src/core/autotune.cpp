// Autotuning: times the eligible backends once per shape key and remembers the winner in memory
// and in a versioned JSON cache file shared by processes. The file is only ever replaced whole
// (temporary file + rename) under an flock, after re-reading and merging what other processes
// wrote; a corrupt, truncated, foreign or old-version file is ignored with one warning and
// rewritten, and a location that cannot be read or written degrades to in-memory tuning.
#include "core/autotune.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/decision_cache.h"
#include "core/json_text.h"
#include "memeff/error.h"

namespace memeff {
namespace detail {
namespace {

constexpr const char* kFormatName = "memeff-autotune";

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// Warnings about one cache path are printed once per process and kind of trouble.
void warn_once(const std::string& what_key, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard lock(mutex);
  if (!warned.insert(what_key).second) return;
  std::cerr << "memeff: warning: " << message << std::endl;
}

// ---------------------------------------------------------------------------------------------
// The in-memory store, mirroring the file at `path`.

struct Store {
  std::mutex mutex;
  bool loaded = false;
  std::string path;  // the cache path the memory was loaded from
  std::map<std::string, TuneEntry> entries;
};

Store& store() {
  static Store* s = new Store;  // never destroyed: usable from static destructors
  return *s;
}

Json entry_to_json(const TuneEntry& e) {
  Json cands = Json::array();
  for (const CandidateTime& c : e.candidates) {
    cands.push_back(Json::object({{"backend", c.backend}, {"ms", c.ms}}));
  }
  return Json::object(
      {{"backend", e.backend}, {"config", e.config}, {"ms", e.ms}, {"candidates", cands}});
}

// Parses one entry; false when any field is missing or of the wrong kind.
bool entry_from_json(const std::string& key, const Json& v, TuneEntry& e) {
  const Json* backend = json_member(v, "backend");
  const Json* config = json_member(v, "config");
  const Json* ms = json_member(v, "ms");
  const Json* cands = json_member(v, "candidates");
  if (!backend || !backend->is_string() || backend->get_ref<const std::string&>().empty()) {
    return false;
  }
  if (!config || !config->is_string() || !ms || !ms->is_number() || !(ms->get<double>() >= 0.0)) {
    return false;
  }
  if (!cands || !cands->is_array()) return false;
  e.key = key;
  e.backend = backend->get<std::string>();
  e.config = config->get<std::string>();
  e.ms = ms->get<double>();
  e.candidates.clear();
  for (const Json& c : *cands) {
    const Json* cb = json_member(c, "backend");
    const Json* cm = json_member(c, "ms");
    if (!cb || !cb->is_string() || !cm || !cm->is_number()) return false;
    e.candidates.push_back({cb->get<std::string>(), cm->get<double>()});
  }
  return true;
}

enum class ReadStatus { ok, missing, unusable };

// Reads the cache file. `ok` fills `entries`; `missing` means no file; `unusable` warns once
// (corrupt, truncated, foreign, other version, unreadable) and yields nothing.
ReadStatus read_cache_file(const std::string& path, std::map<std::string, TuneEntry>& entries) {
  entries.clear();
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) return ReadStatus::missing;
  auto unusable = [&](const std::string& why) {
    warn_once("read:" + path + ":" + why,
              "ignoring the autotune cache " + path + " (" + why + "); it will be rewritten");
    entries.clear();
    return ReadStatus::unusable;
  };
  if (!std::filesystem::is_regular_file(status)) return unusable("not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return unusable(std::string("cannot be read: ") + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return unusable("read error");
  Json doc;
  try {
    doc = Json::parse(text.str());
  } catch (const Json::parse_error& e) {
    return unusable(std::string("not valid JSON: ") + e.what());
  }
  const Json* format = json_member(doc, "format");
  if (!format || !format->is_string() || format->get_ref<const std::string&>() != kFormatName) {
    return unusable("not a memeff autotune file");
  }
  const Json* fv = json_member(doc, "format_version");
  if (!fv || !fv->is_number() || fv->get<double>() != kAutotuneFormatVersion) {
    return unusable("format version is not " + std::to_string(kAutotuneFormatVersion));
  }
  const Json* lib = json_member(doc, "library_version");
  if (!lib || !lib->is_string() || lib->get_ref<const std::string&>() != version()) {
    return unusable("written by memeff " + (lib && lib->is_string() ? lib->get<std::string>() : "?") +
                    ", this is " + version());
  }
  const Json* list = json_member(doc, "entries");
  if (!list || !list->is_object()) return unusable("no entries object");
  for (const auto& [key, value] : list->items()) {
    TuneEntry e;
    if (!entry_from_json(key, value, e)) return unusable("malformed entry " + json_text(Json(key)));
    entries[key] = std::move(e);
  }
  return ReadStatus::ok;
}

std::string cache_document(const std::map<std::string, TuneEntry>& entries) {
  Json list = Json::object();
  for (const auto& [key, e] : entries) list[key] = entry_to_json(e);
  const Json doc = {{"format", kFormatName},
                    {"format_version", kAutotuneFormatVersion},
                    {"library_version", version()},
                    {"entries", std::move(list)}};
  return json_text(doc) + "\n";
}

// Loads the file into memory once per path (caller holds the store's mutex).
void ensure_loaded(Store& s) {
  const std::string path = autotune_cache_path();
  if (s.loaded && s.path == path) return;
  if (s.loaded) invalidate_decisions();  // winners remembered from the previous file
  s.entries.clear();
  s.path = path;
  s.loaded = true;
  std::map<std::string, TuneEntry> from_file;
  if (read_cache_file(path, from_file) == ReadStatus::ok) s.entries = std::move(from_file);
}

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool write_all(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// Merges memory into the file: lock, re-read, merge (memory wins on equal keys), write a
// temporary file in the same directory, rename over the cache. Any failure warns once and leaves
// the decisions in memory. Caller holds the store's mutex.
void persist(Store& s) {
  const std::string& path = s.path;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  auto degrade = [&](const std::string& what) {
    warn_once("write:" + path, "cannot write the autotune cache " + path + " (" + what +
                                   "); autotune results stay in memory for this process");
  };
  std::error_code ec;
  if (!dir.empty()) {
    std::filesystem::create_directories(dir, ec);
    if (ec) return degrade("creating " + dir.string() + ": " + ec.message());
  }
  Fd lock;
  lock.fd = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock.fd < 0) return degrade(std::string("lock file: ") + std::strerror(errno));
  while (::flock(lock.fd, LOCK_EX) != 0) {
    if (errno != EINTR) return degrade(std::string("flock: ") + std::strerror(errno));
  }
  std::map<std::string, TuneEntry> merged;
  read_cache_file(path, merged);  // empty unless valid; a bad file warned once
  for (const auto& [key, e] : s.entries) merged[key] = e;
  static std::atomic<unsigned> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  {
    Fd out;
    out.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out.fd < 0) return degrade(std::string("temporary file: ") + std::strerror(errno));
    if (!write_all(out.fd, cache_document(merged)) || ::fsync(out.fd) != 0) {
      const std::string why = std::strerror(errno);
      ::unlink(tmp.c_str());
      return degrade("writing " + tmp + ": " + why);
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return degrade("renaming " + tmp + ": " + why);
  }
  // Memory takes in what other processes tuned meanwhile.
  for (auto& [key, e] : merged) s.entries.emplace(key, e);
}

// ---------------------------------------------------------------------------------------------
// Timing.

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::string tune_key(const Problem& p, Pass pass,
                     const std::vector<std::shared_ptr<Backend>>& candidates) {
  std::vector<std::string> names;
  for (const auto& c : candidates) names.push_back(c->name());
  std::sort(names.begin(), names.end());
  std::ostringstream os;
  os << (candidates.empty() ? device_label(p.device) : candidates.front()->device_label(p.device))
     << "|" << dtype_name(p.dtype) << "|bh=" << p.B * p.Hq
     << "|lq=" << p.Lq << "|lk=" << p.Lk << "|d=" << p.D << "|dv=" << p.Dv
     << "|causal=" << causal_mode_name(p.causal) << "|dropout=" << (p.has_dropout() ? "on" : "off")
     << "|bias=" << p.bias_pattern();
  if (p.has_bias) os << ":" << dtype_name(p.bias_dtype);
  if (p.packed) os << "|packed";  // sequences of at most lq/lk rows, S = bh / heads
  // Global coordinates only where used: an ordinary call's key has no field for them. What
  // changes the work is the causal shift and whether keys start off a 64-key dropout block, not
  // the starts themselves (a long ring would otherwise fill the cache file).
  if (p.has_global_coordinates()) {
    if (p.causal != CausalMode::none) os << "|shift=" << p.causal_shift();
    os << "|k_start%64=" << p.k_start % 64 << (p.kv_block ? "|kv_block" : "");
  }
  // Window, ALiBi and softcap only where used, so that existing keys stay valid.
  if (p.has_window()) os << "|window=" << p.window_left << "," << p.window_right;
  if (p.has_alibi) os << "|alibi=" << (p.alibi_per_batch ? "bh" : "h");
  if (p.has_softcap()) os << "|softcap";
  os << "|gqa=" << p.group_size() << "|pass=" << (pass == Pass::forward ? "forward" : "backward")
     << "|candidates=";
  for (std::size_t i = 0; i < names.size(); ++i) os << (i ? "," : "") << names[i];
  return os.str();
}

std::optional<TuneEntry> autotune_lookup(const std::string& key) {
  Store& s = store();
  std::lock_guard lock(s.mutex);
  ensure_loaded(s);
  auto it = s.entries.find(key);
  if (it == s.entries.end()) return std::nullopt;
  return it->second;
}

void autotune_record(const TuneEntry& entry) {
  Store& s = store();
  std::lock_guard lock(s.mutex);
  ensure_loaded(s);
  s.entries[entry.key] = entry;
  persist(s);
  invalidate_decisions();
}

TuneOutcome autotune_time(const Problem& problem, Pass pass, const std::string& key,
                          const std::vector<std::shared_ptr<Backend>>& candidates,
                          const Options& options, const PassRunner& run) {
  TuneOutcome outcome;
  outcome.entry.key = key;
  std::vector<CandidateTime> times;
  double best = -1.0;
  for (const std::shared_ptr<Backend>& backend : candidates) {
    // A candidate gets the caller's workspace only when it is large enough; otherwise it
    // allocates its own (on the stream), as a call without workspace would.
    Options o = options;
    o.autotune = false;
    if (o.workspace && o.workspace_bytes < backend->workspace_bytes(problem, pass)) {
      o.workspace = nullptr;
      o.workspace_bytes = 0;
    }
    try {
      auto timer = [&](const std::function<void()>& fn) {
        return backend->time_ms(problem, o, fn);
      };
      auto once = [&] { run(*backend, o); };
      double warm = 0.0;
      for (int w = 0; w < kAutotuneWarmups; ++w) warm = timer(once);
      double ms = warm;
      if (!(best >= 0.0 && warm > kAutotunePruneFactor * best)) {
        std::vector<double> samples;
        for (int r = 0; r < kAutotuneRepeats; ++r) samples.push_back(timer(once));
        ms = median(samples);
      }
      times.push_back({backend->name(), ms});
      if (best < 0.0 || ms < best) best = ms;
    } catch (const Error& e) {
      outcome.failures.push_back(backend->name() + ": " + e.what());
    }
  }
  std::stable_sort(times.begin(), times.end(),
                   [](const CandidateTime& a, const CandidateTime& b) { return a.ms < b.ms; });
  if (!times.empty()) {
    outcome.entry.backend = times.front().backend;
    outcome.entry.ms = times.front().ms;
  }
  outcome.entry.candidates = std::move(times);
  return outcome;
}

}  // namespace detail

std::string autotune_cache_path() {
  const std::string dir = detail::env_or_empty("MEMEFF_CACHE_DIR");
  if (!dir.empty()) return (std::filesystem::path(dir) / "autotune.json").string();
  const std::string xdg = detail::env_or_empty("XDG_CACHE_HOME");
  if (!xdg.empty()) return (std::filesystem::path(xdg) / "memeff" / "autotune.json").string();
  const std::string home = detail::env_or_empty("HOME");
  if (!home.empty()) {
    return (std::filesystem::path(home) / ".cache" / "memeff" / "autotune.json").string();
  }
  return (std::filesystem::temp_directory_path() / "memeff" / "autotune.json").string();
}

std::vector<TuneEntry> autotune_entries() {
  detail::Store& s = detail::store();
  std::lock_guard lock(s.mutex);
  detail::ensure_loaded(s);
  std::vector<TuneEntry> out;
  for (const auto& [key, e] : s.entries) out.push_back(e);
  return out;
}

void autotune_reset_memory() {
  detail::Store& s = detail::store();
  std::lock_guard lock(s.mutex);
  s.entries.clear();
  s.loaded = false;
  detail::invalidate_decisions();
}

bool autotune_enabled(const Options& options) {
  if (options.autotune) return *options.autotune;
  std::string v = detail::env_or_empty("MEMEFF_AUTOTUNE");
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  return v == "1" || v == "true" || v == "on" || v == "yes";
}

}  // namespace memeff
