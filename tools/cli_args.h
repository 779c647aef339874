// Command-line parsing for the memeff program: a small table-driven flag parser (every command
// declares its flags with help text, so `--help` and the errors come from one place) and the
// value parsers shared by the subcommands (shapes, dtypes, causal modes, bias patterns, ranges).
// A bad flag or value throws UsageError (the program exits with status 2).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "memeff/attention.h"
#include "memeff/tensor.h"

namespace memeff::cli {

// A malformed command line: the message names the flag; main prints it and exits with 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// --help was given: the parser printed the help text; main exits with 0.
struct HelpShown {};

struct FlagSpec {
  std::string name;     // "--batch"
  std::string metavar;  // "N" ("" for a switch that takes no value)
  std::string help;
  // Called with the value ("" for a switch). Several values when `multi` is set.
  std::function<void(const std::string& value)> set;
  bool multi = false;  // takes every following argument up to the next flag (--shapes a b c)
};

class FlagParser {
 public:
  FlagParser(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}

  void add(FlagSpec spec) { flags_.push_back(std::move(spec)); }
  void add_section(std::string text) { sections_.push_back(std::move(text)); }
  // Positional arguments are refused unless this is set.
  void allow_positional(std::string metavar) { positional_metavar_ = std::move(metavar); }

  // Parses args (without the program and command names). Prints help to stdout and throws
  // HelpShown on --help/-h; throws UsageError on an unknown flag or a missing value.
  std::vector<std::string> parse(const std::vector<std::string>& args) const;
  std::string help() const;

 private:
  std::string command_, summary_;
  std::vector<FlagSpec> flags_;
  std::vector<std::string> sections_;
  std::string positional_metavar_;
};

// Value parsers; `flag` names the flag in the error.
std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t min_value = 0);
std::uint64_t parse_u64(const std::string& flag, const std::string& text);
double parse_double(const std::string& flag, const std::string& text);
double parse_probability(const std::string& flag, const std::string& text);  // [0, 1)
DType parse_dtype(const std::string& flag, const std::string& text);         // fp32 fp16 bf16
CausalMode parse_causal(const std::string& flag, const std::string& text);   // none top-left bottom-right (0 1 2)
const char* causal_flag_name(CausalMode mode);                               // "top-left"

// A half-open range "A:B", or "N" for the single index N.
struct IndexRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};
IndexRange parse_range(const std::string& flag, const std::string& text);

// Bias broadcast pattern: "none", "full" (= "bhqk"), or four characters over [B, H, Lq, Lk]
// where each of the first three is its letter or '1' (broadcast) and the last is 'k'.
struct BiasPattern {
  bool present = false;
  bool bcast_b = false, bcast_h = false, bcast_q = false;
  std::string text() const;  // "none" or e.g. "1hqk"
};
BiasPattern parse_bias(const std::string& flag, const std::string& text);

std::vector<std::string> split(std::string_view text, char sep);

// The attention problem the run/explain/tune commands build: sizes, flags and RNG state.
struct ShapeConfig {
  std::int64_t B = 2, Hq = 8, Lq = 512, D = 64;
  std::optional<std::int64_t> Hkv, Lk, Dv;  // default: Hq, Lq, D
  std::optional<DType> dtype;               // default: bf16 on cuda, fp32 on cpu
  CausalMode causal = CausalMode::top_left;
  BiasPattern bias;
  double dropout = 0.1;
  std::uint64_t seed = 0, offset = 0;
  std::optional<double> scale;

  std::int64_t hkv() const { return Hkv.value_or(Hq); }
  std::int64_t lk() const { return Lk.value_or(Lq); }
  std::int64_t dv() const { return Dv.value_or(D); }
  DType dtype_on(DeviceType device) const {
    return dtype.value_or(device == DeviceType::cuda ? DType::bf16 : DType::f32);
  }
  // Throws UsageError when the heads do not divide (--heads / --kv-heads).
  void check() const;
  std::string describe(DType resolved) const;  // "B=2 Hq=8 Hkv=8 Lq=512 Lk=512 D=64 Dv=64 ..."
};

// Adds --batch --heads --kv-heads --lq --lk --head-dim --v-head-dim --dtype --causal --bias
// --dropout --seed --offset --scale, writing into `config`.
void add_shape_flags(FlagParser& parser, ShapeConfig& config);

// The --device choice: auto picks cuda when the build has CUDA and a device is present.
enum class DeviceChoice { automatic, cpu, cuda };
DeviceChoice parse_device(const std::string& flag, const std::string& text);

// One line of a `memeff tune --shapes` file: either flags ("--batch 4 --lq 1024 ...", the same
// as `memeff run`) or the compact form B,Hq,Hkv,Lq,Lk,D,Dv,causal,dropout,dtype (trailing
// fields may be omitted and take the defaults). `where` names the line in errors.
ShapeConfig parse_shape_line(const std::string& line, const std::string& where);

}  // namespace memeff::cli
