// The command-line vocabulary of the memeff program, on CLI11: checks that turn a flag's text
// into a value or an error naming the flag and what it expects, the values the commands share
// (shape, dtype, causal mode, device, bias pattern, index range) and the compact shape lines.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memeff/attention.h"
#include "memeff/tensor.h"

namespace memeff::cli {

// A command line that parses but does not hold together (--kv-seqlens without --seqlens, a
// shape file's bad line): the message names the flag. A CLI::ParseError, so it exits with 2 as
// CLI11's own errors do.
class UsageError : public CLI::ValidationError {
 public:
  explicit UsageError(const std::string& message) : CLI::ValidationError(message) {}
};

// Checks of an option's text. The message says what was expected and what came ("expected an
// integer >= 1, got 0"); CLI11 puts the option's name in front of it.
CLI::Validator integer(std::int64_t min_value, std::int64_t max_value = INT64_MAX);  // to decimal
CLI::Validator unsigned64();  // decimal or 0x hex, rewritten to decimal
CLI::Validator finite_number();
CLI::Validator probability();  // [0, 1)
// An option whose text `check` accepts (and may rewrite) before CLI11 converts it into `target`;
// shown as `metavar`.
template <class Target>
CLI::Option* add_checked(CLI::App& app, const std::string& name, Target& target,
                         const std::string& metavar, const CLI::Validator& check,
                         const std::string& help) {
  return app.add_option(name, target, help)->type_name(metavar)->transform(check);
}

// Accepts what `from_text` parses (a function returning std::optional): "expected <what>, got `x`".
template <class FromText>
CLI::Validator parses_as(FromText from_text, std::string what) {
  return CLI::Validator(
      [from_text, what](std::string& text) {
        return from_text(text) ? std::string() : "expected " + what + ", got `" + text + "`";
      },
      "");
}

// An option whose text `from_text` turns into the value (nullopt: the text is not one, and the
// error says it expected `what`). `target` must outlive the parse.
template <class Target, class FromText>
CLI::Option* add_value(CLI::App& app, const std::string& name, Target& target, FromText from_text,
                       const std::string& what, const std::string& metavar,
                       const std::string& help) {
  return app
      .add_option_function<std::string>(
          name, [&target, from_text](const std::string& text) { target = *from_text(text); }, help)
      ->check(parses_as(from_text, what))
      ->type_name(metavar);
}

// "a, b or c"; "a|b|c" for a metavar.
std::string spelled_list(const std::vector<std::string>& names);
std::string metavar_of(const std::vector<std::string>& names);

// An option whose value is one of `names`, kept as the name (for choices the program tells
// apart by name: --format text|bits|npy).
CLI::Option* add_name(CLI::App& app, const std::string& name, std::string& target,
                      const std::vector<std::string>& names, const std::string& help);

// The values the program takes, spelled as the library spells them (causal_mode_name,
// dtype_name): a flag and its error list exactly these.
std::vector<std::string> causal_names();  // none, top_left, bottom_right
// Attention data: fp32, fp16, bf16 (fp64 is the reference's own, int32 is for indices).
std::vector<std::string> data_type_names();
std::optional<DType> data_type_from_name(std::string_view name);
CLI::Option* add_causal(CLI::App& app, const std::string& name, CausalMode& target,
                        const std::string& help);
CLI::Option* add_dtype(CLI::App& app, const std::string& name, std::optional<DType>& target,
                       const std::string& help);

// The --device choice: auto picks cuda when the build has CUDA and a device is present.
enum class DeviceChoice { automatic, cpu, cuda };
CLI::Option* add_device(CLI::App& app, DeviceChoice& target, const std::string& help);

// A half-open range "A:B", or "N" for the single index N.
struct IndexRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
  static std::optional<IndexRange> from_text(std::string_view text);  // nullopt: not a range
};

// Bias broadcast pattern: "none", "full" (= "bhqk"), or four characters over [B, H, Lq, Lk]
// where each of the first three is its letter or '1' (broadcast) and the last is 'k'.
struct BiasPattern {
  bool present = false;
  bool bcast_b = false, bcast_h = false, bcast_q = false;
  std::string text() const;  // "none" or e.g. "1hqk"
  static std::optional<BiasPattern> from_text(std::string_view text);  // nullopt: not a pattern
};

// "LEFT,RIGHT": the two sides of a sliding window, each -1 (unbounded) or >= 0 (nullopt for
// anything else).
std::optional<Window> window_from_text(std::string_view text);

// "L1,L2,..": comma-separated lengths >= 0 (nullopt for anything else).
std::optional<std::vector<std::int64_t>> lengths_from_text(std::string_view text);

// Packed sequences: --seqlens (the query lengths; `seqlens_help` says what the command does with
// them) and --kv-seqlens (the key lengths, which need --seqlens).
void add_packed_flags(CLI::App& app, std::vector<std::int64_t>& seqlens,
                      std::vector<std::int64_t>& kv_seqlens, const std::string& seqlens_help);
// The key lengths: --kv-seqlens, one per query length, or the query lengths themselves. Throws
// UsageError when the counts differ.
std::vector<std::int64_t> packed_key_lengths(const std::vector<std::int64_t>& seqlens,
                                             const std::vector<std::int64_t>& kv_seqlens);

std::vector<std::string> split(std::string_view text, char sep);

// The attention problem the run/explain/tune commands build: sizes, flags and RNG state.
struct ShapeConfig {
  std::int64_t B = 2, Hq = 8, Lq = 512, D = 64;
  std::optional<std::int64_t> Hkv, Lk, Dv;  // default: Hq, Lq, D
  std::optional<DType> dtype;               // default: bf16 on cuda, fp32 on cpu
  CausalMode causal = CausalMode::top_left;
  BiasPattern bias;
  std::optional<DType> bias_dtype;  // default: the inputs' dtype; fp32 is the other choice
  double dropout = 0.1;
  std::uint64_t seed = 0, offset = 0;
  std::optional<double> scale;
  Window window{};       // --window LEFT,RIGHT (docs/window.md)
  bool alibi = false;    // --alibi: the standard slopes of Hq heads (alibi_slopes)
  double softcap = 0.0;  // --softcap C

  bool has_score_modifiers() const { return window.bounded() || alibi || softcap > 0.0; }
  std::int64_t hkv() const { return Hkv.value_or(Hq); }
  std::int64_t lk() const { return Lk.value_or(Lq); }
  std::int64_t dv() const { return Dv.value_or(D); }
  DType dtype_on(DeviceType device) const {
    return dtype.value_or(device == DeviceType::cuda ? DType::bf16 : DType::f32);
  }
  // The bias's (and dbias's) element type for inputs of `resolved`.
  DType bias_dtype_for(DType resolved) const { return bias_dtype.value_or(resolved); }
  // Throws UsageError when the heads do not divide (--heads / --kv-heads), or --bias-dtype is
  // given without a bias.
  void check() const;
  std::string describe(DType resolved) const;  // "B=2 Hq=8 Hkv=8 Lq=512 Lk=512 D=64 Dv=64 ..."
};

// Adds --batch --heads --kv-heads --lq --lk --head-dim --v-head-dim --dtype --causal --bias
// --bias-dtype --dropout --seed --offset --scale --window --alibi --softcap, writing into
// `config`.
void add_shape_flags(CLI::App& app, ShapeConfig& config);

// Parses `text` split at commas as the positional arguments of `fields` (an app whose positionals
// are the fields, in order).
void parse_fields(CLI::App& fields, std::string_view text);

// One line of a `memeff tune --shapes` file: either flags ("--batch 4 --lq 1024 ...", the same
// as `memeff run`) or the compact form B,Hq,Hkv,Lq,Lk,D,Dv,causal,dropout,dtype (trailing
// fields may be omitted and take the defaults). `where` names the line in errors.
ShapeConfig parse_shape_line(const std::string& line, const std::string& where);

}  // namespace memeff::cli
