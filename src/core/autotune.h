// Autotuning internals: the shape key, the timing loop, and the in-memory + file cache of
// winners (src/core/autotune.cpp). The dispatcher (dispatch.cpp) decides when to tune; this
// module measures and remembers.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memeff/backend.h"
#include "memeff/dispatch.h"

namespace memeff::detail {

// Backend::device_label's default (src/core/backend.cpp): "cpu <model name>" for the host,
// "cuda:N" for a GPU.
std::string device_label(Device device);

// The key of a call: device, dtype, B·Hq, Lq, Lk, D, Dv, causal mode, dropout on/off, bias
// broadcast pattern (and dtype), GQA ratio, pass, and the candidate set that was timed (so a
// restricted call never reuses a winner it is not allowed to run).
// The device part comes from the first candidate's Backend::device_label.
std::string tune_key(const Problem& problem, Pass pass,
                     const std::vector<std::shared_ptr<Backend>>& candidates);

// A remembered decision for `key` (loads the cache file on first use).
std::optional<TuneEntry> autotune_lookup(const std::string& key);

// Remembers `entry` in memory and merges it into the cache file (atomic, under a file lock).
void autotune_record(const TuneEntry& entry);

// Runs one pass of `backend` with `options` (the caller's own buffers as outputs).
using PassRunner = std::function<void(Backend& backend, const Options& options)>;

struct TuneOutcome {
  TuneEntry entry;                    // the winner (backend empty when every candidate failed)
  std::vector<std::string> failures;  // "name: what" for candidates that threw while timed
};

// Times every candidate on the problem: kWarmups untimed-for-the-result runs, then kRepeats
// timed runs, median. A candidate whose last warm-up is already kPruneFactor times slower than
// the best median so far is not repeated (its warm-up time stands). Each candidate times itself
// (Backend::time_ms: a steady clock for CPU backends, the device's own timer for GPU ones).
TuneOutcome autotune_time(const Problem& problem, Pass pass, const std::string& key,
                          const std::vector<std::shared_ptr<Backend>>& candidates,
                          const Options& options, const PassRunner& run);

inline constexpr int kAutotuneWarmups = 2;
inline constexpr int kAutotuneRepeats = 5;
inline constexpr double kAutotunePruneFactor = 4.0;
inline constexpr int kAutotuneFormatVersion = 1;

}  // namespace memeff::detail
