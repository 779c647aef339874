// `memeff explain` (which backend the dispatcher picks for a shape, and why, without running
// anything) and `memeff tune` (autotune a list of shapes ahead of time, or show the cache).
// Both are thin layers over memeff::explain and Options::autotune (include/memeff/dispatch.h).
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "cli_args.h"
#include "cli_commands.h"
#include "cli_json.h"
#include "cli_problem.h"
#include "memeff/dispatch.h"
#include "memeff/error.h"

namespace memeff::cli {

namespace {

enum class PassChoice { forward, backward, both };

PassChoice parse_pass(const std::string& flag, const std::string& v) {
  if (v == "forward" || v == "fwd") return PassChoice::forward;
  if (v == "backward" || v == "bwd") return PassChoice::backward;
  if (v == "both") return PassChoice::both;
  throw UsageError(flag + ": expected forward, backward or both, got `" + v + "`");
}

// Views for explain(): it validates and decides without touching data, so the views point at a
// small aligned placeholder instead of allocating the (possibly huge) tensors.
AttentionArgs placeholder_args(const ShapeConfig& c, Device device) {
  alignas(256) static unsigned char placeholder[5][256];
  const DType dtype = c.dtype_on(device.type);
  auto view = [&](int slot, std::vector<std::int64_t> dims) {
    TensorView v;
    v.data = placeholder[slot];
    v.dtype = dtype;
    v.device = device;
    v.rank = 4;
    std::int64_t stride = 1;
    for (int d = 3; d >= 0; --d) {
      v.shape[d] = dims[d];
      v.stride[d] = stride;
      stride *= std::max<std::int64_t>(dims[d], 1);
    }
    return v;
  };
  AttentionArgs a;
  a.q = view(0, {c.B, c.Hq, c.Lq, c.D});
  a.k = view(1, {c.B, c.hkv(), c.lk(), c.D});
  a.v = view(2, {c.B, c.hkv(), c.lk(), c.dv()});
  if (c.bias.present) a.bias = view(3, bias_dims(c));
  a.scale = c.scale;
  a.causal = c.causal;
  a.dropout_p = c.dropout;
  a.rng.seed = c.seed;
  a.rng.offset = c.offset;
  return a;
}

void progress_bar(std::size_t done, std::size_t total, const std::string& what) {
  constexpr int kWidth = 30;
  const int filled = total ? static_cast<int>(kWidth * done / total) : kWidth;
  std::fprintf(stderr, "\r[%s%s] %zu/%zu %-60.60s", std::string(static_cast<std::size_t>(filled), '#').c_str(),
               std::string(static_cast<std::size_t>(kWidth - filled), '.').c_str(), done, total, what.c_str());
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace

int explain_command(const std::vector<std::string>& argv) {
  ShapeConfig shape;
  DeviceChoice device_choice = DeviceChoice::automatic;
  std::string backends;
  PassChoice pass = PassChoice::both;
  bool json = false, autotune = false;
  FlagParser p("memeff explain",
               "Shows the dispatcher's decision for a shape without running it: the priority order and\n"
               "where it came from, every backend with the reasons it cannot run the call, the choice and\n"
               "why (priority, heuristic, user restriction or autotune result). Shape flags as `memeff run`.");
  p.add({"--device", "DEV", "cpu, cuda or auto (default auto). cuda is explained even with no GPU present",
         [&](const std::string& v) { device_choice = parse_device("--device", v); }});
  p.add({"--backend", "LIST", "comma-separated allow-list in priority order (Options::backends), e.g. cuda,cuda_math",
         [&](const std::string& v) { backends = v; }});
  add_shape_flags(p, shape);
  p.add({"--pass", "P", "forward, backward or both (default both)", [&](const std::string& v) { pass = parse_pass("--pass", v); }});
  p.add({"--autotune", "", "explain as a call with Options::autotune = true (shows remembered results)",
         [&](const std::string&) { autotune = true; }});
  p.add({"--json", "", "print JSON ({\"forward\": ..., \"backward\": ...})", [&](const std::string&) { json = true; }});
  p.parse(argv);
  shape.check();

  // explain never touches the device, so `--device cuda` works on a machine without one.
  const Device device = device_choice == DeviceChoice::cpu    ? Device::cpu()
                        : device_choice == DeviceChoice::cuda ? Device::cuda(0)
                                                              : resolve_device(DeviceChoice::automatic, nullptr);
  const AttentionArgs args = placeholder_args(shape, device);
  Options options;
  if (!backends.empty()) options.backends = split(backends, ',');
  if (autotune) options.autotune = true;

  std::vector<std::pair<const char*, Pass>> passes;
  if (pass != PassChoice::backward) passes.emplace_back("forward", Pass::forward);
  if (pass != PassChoice::forward) passes.emplace_back("backward", Pass::backward);
  Json j = Json::object();
  for (const auto& [name, which] : passes) {
    const Explanation ex = explain(args, which, options);
    if (json) {
      j[name] = Json::parse(ex.to_json());
    } else {
      std::printf("== %s ==\n%s", name, ex.to_string().c_str());
      if (!ex.to_string().empty() && ex.to_string().back() != '\n') std::printf("\n");
    }
  }
  if (json) std::printf("%s\n", json_text(j).c_str());
  return 0;
}

int tune_command(const std::vector<std::string>& argv) {
  std::string shapes_file, backends;
  DeviceChoice device_choice = DeviceChoice::automatic;
  bool show = false, json = false;
  FlagParser p("memeff tune",
               "Autotunes shapes ahead of time: for each shape, runs forward and backward once with\n"
               "Options::autotune = true, so the dispatcher times every eligible backend and remembers the\n"
               "fastest in memory and in the cache file ($MEMEFF_CACHE_DIR/autotune.json, else the XDG\n"
               "cache directory). Later calls with the same key (and MEMEFF_AUTOTUNE=1 or the option) reuse it.");
  p.add({"--shapes", "FILE",
         "shapes to tune, one a line ('#' comments and blank lines skipped), either flags as for\n"
         "`memeff run` (--batch 8 --heads 16 --lq 2048 --head-dim 128 --dropout 0.1 ...) or\n"
         "B,Hq,Hkv,Lq,Lk,D[,Dv[,causal[,dropout[,dtype]]]] (causal none|top-left|bottom-right or 0|1|2)",
         [&](const std::string& v) { shapes_file = v; }});
  p.add({"--device", "DEV", "cpu, cuda or auto (default auto)",
         [&](const std::string& v) { device_choice = parse_device("--device", v); }});
  p.add({"--backend", "LIST", "comma-separated candidates (Options::backends; default: every eligible one)",
         [&](const std::string& v) { backends = v; }});
  p.add({"--show", "", "print the remembered decisions and the cache file path, then exit",
         [&](const std::string&) { show = true; }});
  p.add({"--json", "", "with --show: print JSON", [&](const std::string&) { json = true; }});
  p.parse(argv);

  if (show) {
    const std::vector<TuneEntry> entries = autotune_entries();
    const std::string path = autotune_cache_path();
    if (json) {
      Json rows = Json::array();
      for (const TuneEntry& e : entries) {
        Json cands = Json::array();
        for (const CandidateTime& c : e.candidates) cands.push_back({{"backend", c.backend}, {"ms", c.ms}});
        rows.push_back(
            {{"key", e.key}, {"backend", e.backend}, {"config", e.config}, {"ms", e.ms}, {"candidates", cands}});
      }
      std::printf("%s\n", json_text({{"cache", path}, {"entries", rows}}).c_str());
      return 0;
    }
    std::printf("cache file: %s\n%zu entr%s\n", path.c_str(), entries.size(), entries.size() == 1 ? "y" : "ies");
    for (const TuneEntry& e : entries) {
      std::printf("  %s\n    -> %s%s%s  %.4f ms", e.key.c_str(), e.backend.c_str(), e.config.empty() ? "" : " / ",
                  e.config.c_str(), e.ms);
      if (e.candidates.size() > 1) {
        std::printf("  (");
        for (std::size_t c = 0; c < e.candidates.size(); ++c) {
          std::printf("%s%s %.4f ms", c ? ", " : "", e.candidates[c].backend.c_str(), e.candidates[c].ms);
        }
        std::printf(")");
      }
      std::printf("\n");
    }
    return 0;
  }
  if (shapes_file.empty()) throw UsageError("`memeff tune`: give --shapes FILE (or --show)");

  std::ifstream in(shapes_file);
  if (!in) throw Error(ErrorCode::io_error, "--shapes: cannot read `" + shapes_file + "`");
  std::vector<ShapeConfig> shapes;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    shapes.push_back(parse_shape_line(line, shapes_file + ":" + std::to_string(number)));
  }
  if (shapes.empty()) throw UsageError("--shapes: `" + shapes_file + "` holds no shape");

  std::string note;
  const Device device = resolve_device(device_choice, &note);
  if (!note.empty()) std::fprintf(stderr, "memeff tune: %s\n", note.c_str());
  Options options;
  if (!backends.empty()) options.backends = split(backends, ',');
  options.autotune = true;

  std::vector<std::string> results;
  int failures = 0;
  for (std::size_t s = 0; s < shapes.size(); ++s) {
    const ShapeConfig& c = shapes[s];
    const DType dtype = c.dtype_on(device.type);
    progress_bar(s, shapes.size(), c.describe(dtype));
    try {
      AttentionData d = make_attention_data(c, device);
      const AttentionArgs args = d.args();
      const BackwardTensors grads = d.grads();
      const CallInfo f = forward(args, grads.out, grads.lse, options);
      const CallInfo b = backward(args, grads, options);
      synchronize(device);
      results.push_back(c.describe(dtype) + "\n    forward -> " + f.backend + ", backward -> " + b.backend);
    } catch (const Error& e) {
      ++failures;
      results.push_back(c.describe(dtype) + "\n    failed: " + e.what());
    }
  }
  progress_bar(shapes.size(), shapes.size(), "done");
  for (const std::string& r : results) std::printf("%s\n", r.c_str());
  std::printf("cache file: %s\n", autotune_cache_path().c_str());
  return failures ? 1 : 0;
}

}  // namespace memeff::cli
