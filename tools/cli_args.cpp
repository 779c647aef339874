// The memeff program's option checks and shared values (see cli_args.h). Every error names the
// option and the offending text, so a user can fix the command line without reading the source.
#include "cli_args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace memeff::cli {

namespace {

// The whole of `text` as a number, or nullopt.
std::optional<long long> whole_integer(const std::string& text, int base) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, base);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) return std::nullopt;
  return v;
}

std::optional<double> whole_number(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace

CLI::Validator integer(std::int64_t min_value, std::int64_t max_value) {
  return CLI::Validator(
      [min_value, max_value](std::string& text) -> std::string {
        const std::optional<long long> v = whole_integer(text, 10);
        if (!v) return "expected an integer, got `" + text + "`";
        const auto bound = [&](const char* op, std::int64_t limit) {
          return "expected an integer " + std::string(op) + " " + std::to_string(limit) + ", got " +
                 text;
        };
        if (*v < min_value) return bound(">=", min_value);
        if (*v > max_value) return bound("<=", max_value);
        text = std::to_string(*v);  // CLI11 would read a leading 0 as octal
        return "";
      },
      "");
}

CLI::Validator unsigned64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const unsigned long long v = std::strtoull(text.c_str(), &end, 0);
        if (text.empty() || text[0] == '-' || end != text.c_str() + text.size() ||
            errno == ERANGE) {
          return "expected an unsigned 64-bit integer, got `" + text + "`";
        }
        text = std::to_string(v);
        return "";
      },
      "");
}

CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& text) {
        return whole_number(text) ? std::string() : "expected a finite number, got `" + text + "`";
      },
      "");
}

CLI::Validator probability() {
  return CLI::Validator(
      [](std::string& text) {
        const std::optional<double> p = whole_number(text);
        return p && *p >= 0.0 && *p < 1.0 ? std::string()
                                          : "expected a probability in [0, 1), got `" + text + "`";
      },
      "");
}

std::string spelled_list(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) {
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  }
  return s;
}

std::string metavar_of(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : "|") + n;
  return s;
}

CLI::Option* add_name(CLI::App& app, const std::string& name, std::string& target,
                      const std::vector<std::string>& names, const std::string& help) {
  auto from_name = [names](std::string_view text) -> std::optional<std::string> {
    if (std::find(names.begin(), names.end(), text) == names.end()) return std::nullopt;
    return std::string(text);
  };
  return add_value(app, name, target, from_name, spelled_list(names), metavar_of(names), help);
}

std::vector<std::string> causal_names() {
  std::vector<std::string> names;
  for (CausalMode m : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    names.emplace_back(causal_mode_name(m));
  }
  return names;
}

namespace {
constexpr DType kDataTypes[] = {DType::f32, DType::f16, DType::bf16};
}  // namespace

std::vector<std::string> data_type_names() {
  std::vector<std::string> names;
  for (DType d : kDataTypes) names.emplace_back(dtype_name(d));
  return names;
}

std::optional<DType> data_type_from_name(std::string_view name) {
  const std::optional<DType> d = dtype_from_name(name);
  if (d && std::find(std::begin(kDataTypes), std::end(kDataTypes), *d) == std::end(kDataTypes)) {
    return std::nullopt;
  }
  return d;
}

CLI::Option* add_causal(CLI::App& app, const std::string& name, CausalMode& target,
                        const std::string& help) {
  const std::vector<std::string> names = causal_names();
  return add_value(app, name, target, causal_mode_from_name, spelled_list(names), metavar_of(names),
                   help);
}

CLI::Option* add_dtype(CLI::App& app, const std::string& name, std::optional<DType>& target,
                       const std::string& help) {
  const std::vector<std::string> names = data_type_names();
  return add_value(app, name, target, data_type_from_name, spelled_list(names), metavar_of(names),
                   help);
}

CLI::Option* add_device(CLI::App& app, DeviceChoice& target, const std::string& help) {
  auto from_name = [](std::string_view name) -> std::optional<DeviceChoice> {
    if (name == "cpu") return DeviceChoice::cpu;
    if (name == "cuda") return DeviceChoice::cuda;
    if (name == "auto") return DeviceChoice::automatic;
    return std::nullopt;
  };
  return add_value(app, "--device", target, from_name, "cpu, cuda or auto", "cpu|cuda|auto", help);
}

std::optional<IndexRange> IndexRange::from_text(std::string_view text) {
  const std::string s(text);
  const auto colon = s.find(':');
  const std::optional<long long> begin = whole_integer(s.substr(0, colon), 10);
  if (!begin || *begin < 0) return std::nullopt;
  if (colon == std::string::npos) return IndexRange{*begin, *begin + 1};
  const std::optional<long long> end = whole_integer(s.substr(colon + 1), 10);
  if (!end || *end < *begin) return std::nullopt;
  return IndexRange{*begin, *end};
}

std::string BiasPattern::text() const {
  if (!present) return "none";
  return std::string() + (bcast_b ? '1' : 'b') + (bcast_h ? '1' : 'h') + (bcast_q ? '1' : 'q') + 'k';
}

std::optional<BiasPattern> BiasPattern::from_text(std::string_view text) {
  BiasPattern p;
  if (text == "none") return p;
  const std::string_view pattern = text == "full" ? "bhqk" : text;
  const char* letters = "bhqk";
  bool ok = pattern.size() == 4 && pattern[3] == 'k';
  for (int d = 0; ok && d < 3; ++d) ok = pattern[d] == letters[d] || pattern[d] == '1';
  if (!ok) return std::nullopt;
  p.present = true;
  p.bcast_b = pattern[0] == '1';
  p.bcast_h = pattern[1] == '1';
  p.bcast_q = pattern[2] == '1';
  return p;
}

std::optional<std::vector<std::int64_t>> lengths_from_text(std::string_view text) {
  std::vector<std::int64_t> lengths;
  for (const std::string& part : split(text, ',')) {
    const std::optional<long long> n = whole_integer(part, 10);
    if (!n || *n < 0) return std::nullopt;
    lengths.push_back(*n);
  }
  return lengths;
}

void add_packed_flags(CLI::App& app, std::vector<std::int64_t>& seqlens,
                      std::vector<std::int64_t>& kv_seqlens, const std::string& seqlens_help) {
  const std::string lengths = "comma-separated lengths >= 0";
  CLI::Option* q =
      add_value(app, "--seqlens", seqlens, lengths_from_text, lengths, "L1,L2,..", seqlens_help);
  add_value(app, "--kv-seqlens", kv_seqlens, lengths_from_text, lengths, "L1,L2,..",
            "key lengths of the packed sequences (default: the query lengths)")
      ->needs(q);
}

std::vector<std::int64_t> packed_key_lengths(const std::vector<std::int64_t>& seqlens,
                                             const std::vector<std::int64_t>& kv_seqlens) {
  if (kv_seqlens.empty()) return seqlens;
  if (kv_seqlens.size() != seqlens.size()) {
    throw UsageError("--kv-seqlens: expected " + std::to_string(seqlens.size()) +
                     " lengths (one per --seqlens entry), got " +
                     std::to_string(kv_seqlens.size()));
  }
  return kv_seqlens;
}

std::optional<Window> window_from_text(std::string_view text) {
  const std::vector<std::string> sides = split(text, ',');
  if (sides.size() != 2) return std::nullopt;
  const std::optional<long long> left = whole_integer(sides[0], 10),
                                 right = whole_integer(sides[1], 10);
  if (!left || !right || *left < -1 || *right < -1) return std::nullopt;
  return Window{*left, *right};
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t pos = text.find(sep, start);
    parts.emplace_back(text.substr(start, pos == std::string_view::npos ? text.npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return parts;
}

void ShapeConfig::check() const {
  if (hkv() < 1 && Hq > 0) throw UsageError("--kv-heads: expected >= 1, got " + std::to_string(hkv()));
  if (hkv() > 0 && Hq % hkv() != 0) {
    throw UsageError("--kv-heads: the query heads (--heads " + std::to_string(Hq) +
                     ") must be a multiple of the key/value heads, got " + std::to_string(hkv()));
  }
  if (bias_dtype && !bias.present) throw UsageError("--bias-dtype: given without --bias");
  if (softcap < 0.0)
    throw UsageError("--softcap: expected a number >= 0 (0: off), got " + std::to_string(softcap));
}

std::string ShapeConfig::describe(DType resolved) const {
  std::ostringstream os;
  os << "B=" << B << " Hq=" << Hq << " Hkv=" << hkv() << " Lq=" << Lq << " Lk=" << lk()
     << " D=" << D << " Dv=" << dv() << " " << dtype_name(resolved)
     << " causal=" << causal_mode_name(causal) << " bias=" << bias.text();
  if (bias.present) os << "/" << dtype_name(bias_dtype_for(resolved));
  os << " dropout=" << dropout;
  if (window.bounded()) os << " window=" << window.left << "," << window.right;
  if (alibi) os << " alibi";
  if (softcap > 0.0) os << " softcap=" << softcap;
  return os.str();
}

void add_shape_flags(CLI::App& app, ShapeConfig& c) {
  add_checked(app, "--batch", c.B, "N", integer(0), "batch size B (default 2)");
  add_checked(app, "--heads", c.Hq, "N", integer(1), "query heads Hq (default 8)");
  add_checked(app, "--kv-heads", c.Hkv, "N", integer(1),
              "key/value heads Hkv, dividing Hq (default Hq; fewer is GQA/MQA)");
  add_checked(app, "--lq", c.Lq, "N", integer(0), "query length Lq (default 512)");
  add_checked(app, "--lk", c.Lk, "N", integer(0), "key length Lk (default Lq)");
  add_checked(app, "--head-dim", c.D, "N", integer(1), "head dimension D of q and k (default 64)");
  add_checked(app, "--v-head-dim", c.Dv, "N", integer(1),
              "head dimension Dv of v and out (default D)");
  add_dtype(app, "--dtype", c.dtype, "element type (default bf16 on cuda, fp32 on cpu)");
  add_causal(app, "--causal", c.causal, "causal mask (default top_left)");
  add_value(
      app, "--bias", c.bias, BiasPattern::from_text,
      "none, full or a pattern over [B, H, Lq, Lk] such as 1hqk or b11k (a 1 marks a broadcast "
      "dimension; Lk cannot broadcast)",
      "PATTERN",
      "none (default), full, or a broadcast pattern over [B,H,Lq,Lk]:\n"
      "a 1 marks a broadcast dim, e.g. 1hqk, b11k, 11qk, 111k; full = bhqk");
  add_dtype(app, "--bias-dtype", c.bias_dtype,
            "element type of the bias and its gradient: the inputs' (default) or fp32");
  add_checked(app, "--dropout", c.dropout, "P", probability(),
              "dropout probability in [0, 1) (default 0.1)");
  add_checked(app, "--seed", c.seed, "S", unsigned64(),
              "dropout seed, 64-bit (default 0); also seeds the random inputs");
  add_checked(app, "--offset", c.offset, "O", unsigned64(), "dropout offset, 64-bit (default 0)");
  add_checked(app, "--scale", c.scale, "X", finite_number(), "softmax scale (default 1/sqrt(D))");
  add_value(app, "--window", c.window, window_from_text,
            "LEFT,RIGHT with each side -1 (unbounded) or >= 0", "LEFT,RIGHT",
            "sliding window: query i sees keys i+shift-LEFT .. i+shift+RIGHT, -1 unbounded\n"
            "(shift as the causal alignment; Lk-Lq without causal; docs/window.md)");
  app.add_flag("--alibi", c.alibi,
               "ALiBi with the standard slopes: 2^(-8(h+1)/Hq) for a power-of-two Hq,\n"
               "else those of the next lower power of two n then 2^(-4(2k+1)/n)");
  add_checked(app, "--softcap", c.softcap, "C", finite_number(),
              "logit softcap: the scaled score s becomes C*tanh(s/C) (default 0: off)");
}

void parse_fields(CLI::App& fields, std::string_view text) {
  std::vector<std::string> args = split(text, ',');
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last first
  fields.parse(std::move(args));
}

ShapeConfig parse_shape_line(const std::string& line, const std::string& where) {
  ShapeConfig c;
  const auto first = line.find_first_not_of(" \t\r\n");
  const std::string trimmed =
      first == std::string::npos ? ""
                                 : line.substr(first, line.find_last_not_of(" \t\r\n") - first + 1);
  CLI::App shape("one shape", where);
  shape.set_help_flag();  // --help is not a shape
  try {
    if (!trimmed.empty() && trimmed[0] == '-') {
      add_shape_flags(shape, c);
      shape.parse(trimmed);
    } else {
      const std::size_t fields = split(trimmed, ',').size();
      if (fields < 6 || fields > 10) {
        throw UsageError("expected B,Hq,Hkv,Lq,Lk,D[,Dv[,causal[,dropout[,dtype]]]] or flags, got `" +
                         trimmed + "`");
      }
      shape.add_option("B", c.B)->transform(integer(0));
      shape.add_option("Hq", c.Hq)->transform(integer(1));
      shape.add_option("Hkv", c.Hkv)->transform(integer(1));
      shape.add_option("Lq", c.Lq)->transform(integer(0));
      shape.add_option("Lk", c.Lk)->transform(integer(0));
      shape.add_option("D", c.D)->transform(integer(1));
      shape.add_option("Dv", c.Dv)->transform(integer(1));
      add_causal(shape, "causal", c.causal, "");
      shape.add_option("dropout", c.dropout)->check(probability());
      add_dtype(shape, "dtype", c.dtype, "");
      parse_fields(shape, trimmed);
    }
    c.check();
  } catch (const CLI::ParseError& e) {  // UsageError too
    throw UsageError(where + ": " + e.what());
  }
  return c;
}

}  // namespace memeff::cli
