// Flag parsing and value parsers of the memeff program (see cli_args.h). Every error names the
// flag and the offending text, so a user can fix the command line without reading the source.
#include "cli_args.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace memeff::cli {

namespace {

bool is_flag(const std::string& arg) { return arg.size() > 1 && arg[0] == '-' && !std::isdigit(static_cast<unsigned char>(arg[1])) && arg[1] != '.'; }

}  // namespace

std::vector<std::string> FlagParser::parse(const std::vector<std::string>& args) const {
  std::vector<std::string> positional;
  for (std::size_t a = 0; a < args.size(); ++a) {
    const std::string& arg = args[a];
    if (arg == "--help" || arg == "-h") {
      std::fputs(help().c_str(), stdout);
      throw HelpShown{};
    }
    if (!is_flag(arg)) {
      if (positional_metavar_.empty()) {
        throw UsageError("`" + command_ + "`: unexpected argument `" + arg + "` (see `" + command_ +
                         " --help`)");
      }
      positional.push_back(arg);
      continue;
    }
    std::string name = arg, inline_value;
    bool has_inline = false;
    if (const auto eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
      has_inline = true;
    }
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& f : flags_) {
      if (f.name == name) spec = &f;
    }
    if (spec == nullptr) {
      throw UsageError("`" + command_ + "`: unknown flag `" + name + "` (see `" + command_ +
                       " --help`)");
    }
    if (spec->metavar.empty()) {
      if (has_inline) throw UsageError(name + ": takes no value, got `" + inline_value + "`");
      spec->set("");
      continue;
    }
    std::vector<std::string> values;
    if (has_inline) values.push_back(inline_value);
    if (spec->multi) {
      while (a + 1 < args.size() && !is_flag(args[a + 1])) values.push_back(args[++a]);
    } else if (!has_inline) {
      if (a + 1 >= args.size() || is_flag(args[a + 1])) {
        throw UsageError(name + ": expected a value (" + spec->metavar + ")");
      }
      values.push_back(args[++a]);
    }
    if (values.empty()) throw UsageError(name + ": expected one or more values (" + spec->metavar + ")");
    for (const std::string& v : values) spec->set(v);
  }
  return positional;
}

std::string FlagParser::help() const {
  std::ostringstream os;
  os << "usage: " << command_ << " [flags]" << (positional_metavar_.empty() ? "" : " " + positional_metavar_)
     << "\n\n"
     << summary_ << "\n\nflags:\n";
  for (const FlagSpec& f : flags_) {
    std::string left = "  " + f.name + (f.metavar.empty() ? "" : " " + f.metavar);
    if (left.size() < 26) left.resize(26, ' ');
    else left += "\n" + std::string(26, ' ');
    os << left;
    // Indent continuation lines of the help text under the first.
    for (char c : f.help) {
      os << c;
      if (c == '\n') os << std::string(26, ' ');
    }
    os << "\n";
  }
  os << "  --help, -h              this text\n";
  for (const std::string& s : sections_) os << "\n" << s << "\n";
  return os.str();
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

std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t min_value) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    throw UsageError(flag + ": expected an integer, got `" + text + "`");
  }
  if (v < min_value) {
    throw UsageError(flag + ": expected an integer >= " + std::to_string(min_value) + ", got " + text);
  }
  return v;
}

std::uint64_t parse_u64(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 0);
  if (text.empty() || text[0] == '-' || end != text.c_str() + text.size() || errno == ERANGE) {
    throw UsageError(flag + ": expected an unsigned 64-bit integer, got `" + text + "`");
  }
  return v;
}

double parse_double(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v)) {
    throw UsageError(flag + ": expected a finite number, got `" + text + "`");
  }
  return v;
}

double parse_probability(const std::string& flag, const std::string& text) {
  const double p = parse_double(flag, text);
  if (p < 0.0 || p >= 1.0) throw UsageError(flag + ": expected a probability in [0, 1), got " + text);
  return p;
}

DType parse_dtype(const std::string& flag, const std::string& text) {
  if (text == "fp32" || text == "f32" || text == "float32") return DType::f32;
  if (text == "fp16" || text == "f16" || text == "float16") return DType::f16;
  if (text == "bf16" || text == "bfloat16") return DType::bf16;
  throw UsageError(flag + ": expected fp32, fp16 or bf16, got `" + text + "`");
}

CausalMode parse_causal(const std::string& flag, const std::string& text) {
  if (text == "none" || text == "0") return CausalMode::none;
  if (text == "top-left" || text == "top_left" || text == "1") return CausalMode::top_left;
  if (text == "bottom-right" || text == "bottom_right" || text == "2") return CausalMode::bottom_right;
  throw UsageError(flag + ": expected none, top-left or bottom-right (or 0, 1, 2), got `" + text + "`");
}

const char* causal_flag_name(CausalMode mode) {
  switch (mode) {
    case CausalMode::none: return "none";
    case CausalMode::top_left: return "top-left";
    case CausalMode::bottom_right: return "bottom-right";
  }
  return "?";
}

IndexRange parse_range(const std::string& flag, const std::string& text) {
  const auto colon = text.find(':');
  IndexRange r;
  if (colon == std::string::npos) {
    r.begin = parse_int(flag, text, 0);
    r.end = r.begin + 1;
    return r;
  }
  r.begin = parse_int(flag, text.substr(0, colon), 0);
  r.end = parse_int(flag, text.substr(colon + 1), 0);
  if (r.end < r.begin) throw UsageError(flag + ": expected A:B with A <= B, got `" + text + "`");
  return r;
}

std::string BiasPattern::text() const {
  if (!present) return "none";
  return std::string() + (bcast_b ? '1' : 'b') + (bcast_h ? '1' : 'h') + (bcast_q ? '1' : 'q') + 'k';
}

BiasPattern parse_bias(const std::string& flag, const std::string& text) {
  BiasPattern p;
  if (text == "none") return p;
  const std::string pattern = text == "full" ? "bhqk" : text;
  const char* letters = "bhqk";
  bool ok = pattern.size() == 4 && pattern[3] == 'k';
  for (int d = 0; ok && d < 3; ++d) ok = pattern[d] == letters[d] || pattern[d] == '1';
  if (!ok) {
    throw UsageError(flag + ": expected none, full or a pattern over [B, H, Lq, Lk] such as 1hqk or "
                            "b11k (a 1 marks a broadcast dimension; Lk cannot broadcast), got `" +
                     text + "`");
  }
  p.present = true;
  p.bcast_b = pattern[0] == '1';
  p.bcast_h = pattern[1] == '1';
  p.bcast_q = pattern[2] == '1';
  return p;
}

DeviceChoice parse_device(const std::string& flag, const std::string& text) {
  if (text == "auto") return DeviceChoice::automatic;
  if (text == "cpu") return DeviceChoice::cpu;
  if (text == "cuda" || text == "gpu") return DeviceChoice::cuda;
  throw UsageError(flag + ": expected cpu, cuda or auto, got `" + text + "`");
}

void ShapeConfig::check() const {
  if (hkv() < 1 && Hq > 0) throw UsageError("--kv-heads: expected >= 1, got " + std::to_string(hkv()));
  if (hkv() > 0 && Hq % hkv() != 0) {
    throw UsageError("--kv-heads: the query heads (--heads " + std::to_string(Hq) +
                     ") must be a multiple of the key/value heads, got " + std::to_string(hkv()));
  }
}

std::string ShapeConfig::describe(DType resolved) const {
  std::ostringstream os;
  os << "B=" << B << " Hq=" << Hq << " Hkv=" << hkv() << " Lq=" << Lq << " Lk=" << lk() << " D=" << D
     << " Dv=" << dv() << " " << dtype_name(resolved) << " causal=" << causal_flag_name(causal)
     << " bias=" << bias.text() << " dropout=" << dropout;
  return os.str();
}

void add_shape_flags(FlagParser& parser, ShapeConfig& c) {
  auto int_flag = [&](const char* name, std::int64_t* target, std::int64_t min_value, const char* help) {
    parser.add({name, "N", help, [=](const std::string& v) { *target = parse_int(name, v, min_value); }});
  };
  auto opt_int_flag = [&](const char* name, std::optional<std::int64_t>* target, std::int64_t min_value,
                          const char* help) {
    parser.add({name, "N", help, [=](const std::string& v) { *target = parse_int(name, v, min_value); }});
  };
  int_flag("--batch", &c.B, 0, "batch size B (default 2)");
  int_flag("--heads", &c.Hq, 1, "query heads Hq (default 8)");
  opt_int_flag("--kv-heads", &c.Hkv, 1, "key/value heads Hkv, dividing Hq (default Hq; fewer is GQA/MQA)");
  int_flag("--lq", &c.Lq, 0, "query length Lq (default 512)");
  opt_int_flag("--lk", &c.Lk, 0, "key length Lk (default Lq)");
  int_flag("--head-dim", &c.D, 1, "head dimension D of q and k (default 64)");
  opt_int_flag("--v-head-dim", &c.Dv, 1, "head dimension Dv of v and out (default D)");
  parser.add({"--dtype", "T", "fp32, fp16 or bf16 (default bf16 on cuda, fp32 on cpu)",
              [&c](const std::string& v) { c.dtype = parse_dtype("--dtype", v); }});
  parser.add({"--causal", "MODE", "none, top-left or bottom-right (default top-left)",
              [&c](const std::string& v) { c.causal = parse_causal("--causal", v); }});
  parser.add({"--bias", "PATTERN",
              "none (default), full, or a broadcast pattern over [B,H,Lq,Lk]:\n"
              "a 1 marks a broadcast dim, e.g. 1hqk, b11k, 11qk, 111k; full = bhqk",
              [&c](const std::string& v) { c.bias = parse_bias("--bias", v); }});
  parser.add({"--dropout", "P", "dropout probability in [0, 1) (default 0.1)",
              [&c](const std::string& v) { c.dropout = parse_probability("--dropout", v); }});
  parser.add({"--seed", "S", "dropout seed, 64-bit (default 0); also seeds the random inputs",
              [&c](const std::string& v) { c.seed = parse_u64("--seed", v); }});
  parser.add({"--offset", "O", "dropout offset, 64-bit (default 0)",
              [&c](const std::string& v) { c.offset = parse_u64("--offset", v); }});
  parser.add({"--scale", "X", "softmax scale (default 1/sqrt(D))",
              [&c](const std::string& v) { c.scale = parse_double("--scale", v); }});
}

ShapeConfig parse_shape_line(const std::string& line, const std::string& where) {
  ShapeConfig c;
  std::string trimmed = line;
  while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.back()))) trimmed.pop_back();
  while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.front()))) trimmed.erase(0, 1);
  try {
    if (!trimmed.empty() && trimmed[0] == '-') {
      std::vector<std::string> args;
      std::istringstream is(trimmed);
      for (std::string a; is >> a;) args.push_back(a);
      FlagParser parser("shape", "one shape");
      add_shape_flags(parser, c);
      parser.parse(args);
    } else {
      const std::vector<std::string> f = split(trimmed, ',');
      static const char* names[] = {"B", "Hq", "Hkv", "Lq", "Lk", "D", "Dv", "causal", "dropout", "dtype"};
      if (f.size() < 6 || f.size() > 10) {
        throw UsageError("expected B,Hq,Hkv,Lq,Lk,D[,Dv[,causal[,dropout[,dtype]]]] or flags, got `" +
                         trimmed + "`");
      }
      auto field = [&](std::size_t i) { return std::string(names[i]); };
      c.B = parse_int(field(0), f[0], 0);
      c.Hq = parse_int(field(1), f[1], 1);
      c.Hkv = parse_int(field(2), f[2], 1);
      c.Lq = parse_int(field(3), f[3], 0);
      c.Lk = parse_int(field(4), f[4], 0);
      c.D = parse_int(field(5), f[5], 1);
      if (f.size() > 6) c.Dv = parse_int(field(6), f[6], 1);
      if (f.size() > 7) c.causal = parse_causal(field(7), f[7]);
      if (f.size() > 8) c.dropout = parse_probability(field(8), f[8]);
      if (f.size() > 9) c.dtype = parse_dtype(field(9), f[9]);
    }
    c.check();
  } catch (const HelpShown&) {
    throw UsageError(where + ": --help is not a shape");
  } catch (const UsageError& e) {
    throw UsageError(where + ": " + e.what());
  }
  return c;
}

}  // namespace memeff::cli
