// `memeff explain` (which backend the dispatcher picks for a shape, and why, without running
// anything) and `memeff tune` (autotune a list of shapes ahead of time, or show the cache).
// Both are thin layers over memeff::explain and Options::autotune (include/memeff/dispatch.h).
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
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

std::optional<PassChoice> pass_from_name(std::string_view name) {
  if (name == "forward") return PassChoice::forward;
  if (name == "backward") return PassChoice::backward;
  if (name == "both") return PassChoice::both;
  return std::nullopt;
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
  TensorView slopes = view(4, {1, 1, 1, c.Hq});  // fp32 [Hq]: reshaped below
  slopes.dtype = DType::f32;
  slopes.rank = 1;
  slopes.shape = {c.Hq, 0, 0, 0};
  slopes.stride = {1, 0, 0, 0};
  return make_args(c, view(0, {c.B, c.Hq, c.Lq, c.D}), view(1, {c.B, c.hkv(), c.lk(), c.D}),
                   view(2, {c.B, c.hkv(), c.lk(), c.dv()}), view(3, bias_dims(c)), slopes);
}

void progress_bar(std::size_t done, std::size_t total, const std::string& what) {
  constexpr int kWidth = 30;
  const int filled = total ? static_cast<int>(kWidth * done / total) : kWidth;
  std::fprintf(stderr, "\r[%s%s] %zu/%zu %-60.60s", std::string(static_cast<std::size_t>(filled), '#').c_str(),
               std::string(static_cast<std::size_t>(kWidth - filled), '.').c_str(), done, total, what.c_str());
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

struct ExplainConfig {
  ShapeConfig shape;
  DeviceChoice device = DeviceChoice::automatic;
  std::string backends;
  PassChoice pass = PassChoice::both;
  bool json = false, autotune = false;
};

int explain_shape(const ExplainConfig& ec) {
  ec.shape.check();
  // explain never touches the device, so `--device cuda` works on a machine without one.
  const Device device = ec.device == DeviceChoice::cpu ? Device::cpu()
                        : ec.device == DeviceChoice::cuda
                            ? Device::cuda(0)
                            : resolve_device(DeviceChoice::automatic, nullptr);
  const AttentionArgs args = placeholder_args(ec.shape, device);
  Options options;
  if (!ec.backends.empty()) options.backends = split(ec.backends, ',');
  options.autotune = ec.autotune;

  std::vector<std::pair<const char*, Pass>> passes;
  if (ec.pass != PassChoice::backward) passes.emplace_back("forward", Pass::forward);
  if (ec.pass != PassChoice::forward) passes.emplace_back("backward", Pass::backward);
  Json j = Json::object();
  for (const auto& [name, which] : passes) {
    const Explanation ex = explain(args, which, options);
    if (ec.json) {
      j[name] = Json::parse(ex.to_json());
    } else {
      std::printf("== %s ==\n%s", name, ex.to_string().c_str());
      if (!ex.to_string().empty() && ex.to_string().back() != '\n') std::printf("\n");
    }
  }
  if (ec.json) std::printf("%s\n", json_text(j).c_str());
  return 0;
}

struct TuneConfig {
  std::string shapes_file, backends;
  DeviceChoice device = DeviceChoice::automatic;
  bool show = false, json = false;
};

int tune(const TuneConfig& tc) {
  if (tc.show) {
    const std::vector<TuneEntry> entries = autotune_entries();
    const std::string path = autotune_cache_path();
    if (tc.json) {
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
  if (tc.shapes_file.empty()) throw UsageError("`memeff tune`: give --shapes FILE (or --show)");

  std::ifstream in(tc.shapes_file);
  if (!in) throw Error(ErrorCode::io_error, "--shapes: cannot read `" + tc.shapes_file + "`");
  std::vector<ShapeConfig> shapes;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    shapes.push_back(parse_shape_line(line, tc.shapes_file + ":" + std::to_string(number)));
  }
  if (shapes.empty()) throw UsageError("--shapes: `" + tc.shapes_file + "` holds no shape");

  std::string note;
  const Device device = resolve_device(tc.device, &note);
  if (!note.empty()) std::fprintf(stderr, "memeff tune: %s\n", note.c_str());
  Options options;
  if (!tc.backends.empty()) options.backends = split(tc.backends, ',');
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

}  // namespace

Command add_explain_command(CLI::App& program) {
  auto ec = std::make_shared<ExplainConfig>();
  CLI::App* app = program.add_subcommand(
      "explain", R"(show which backend the dispatcher picks for a shape, and why

Shows the dispatcher's decision for a shape without running it: the priority order and
where it came from, every backend with the reasons it cannot run the call, the choice and
why (priority, heuristic, user restriction or autotune result). Shape flags as `memeff run`.
)");
  add_device(*app, ec->device,
             "default auto. cuda is explained even with no GPU present: each CUDA backend then "
             "says why it cannot run");
  app->add_option(
         "--backend", ec->backends,
         "comma-separated allow-list in priority order (Options::backends), e.g. cuda,cuda_math")
      ->type_name("LIST");
  add_shape_flags(*app, ec->shape);
  add_value(*app, "--pass", ec->pass, pass_from_name, "forward, backward or both",
            "forward|backward|both", "the passes to explain (default both)");
  app->add_flag("--autotune", ec->autotune,
                "explain as a call with Options::autotune = true (shows remembered results)");
  app->add_flag("--json", ec->json, "print JSON ({\"forward\": ..., \"backward\": ...})");
  return {app, [ec](const std::vector<std::string>&) { return explain_shape(*ec); }};
}

Command add_tune_command(CLI::App& program) {
  auto tc = std::make_shared<TuneConfig>();
  CLI::App* app = program.add_subcommand(
      "tune", R"(autotune a list of shapes ahead of time (--shapes FILE), or --show the cache

Autotunes shapes ahead of time: for each shape, runs forward and backward once with
Options::autotune = true, so the dispatcher times every eligible backend and remembers the
fastest in memory and in the cache file ($MEMEFF_CACHE_DIR/autotune.json, else the XDG
cache directory). Later calls with the same key (and MEMEFF_AUTOTUNE=1 or the option) reuse it.
)");
  app->add_option(
         "--shapes", tc->shapes_file,
         "shapes to tune, one a line ('#' comments and blank lines skipped), either flags as for\n"
         "`memeff run` (--batch 8 --heads 16 --lq 2048 --head-dim 128 --dropout 0.1 ...) or\n"
         "B,Hq,Hkv,Lq,Lk,D[,Dv[,causal[,dropout[,dtype]]]] (causal " +
             spelled_list(causal_names()) + ")")
      ->type_name("FILE");
  add_device(*app, tc->device, "default auto");
  app->add_option("--backend", tc->backends,
                  "comma-separated candidates (Options::backends; default: every eligible one)")
      ->type_name("LIST");
  app->add_flag("--show", tc->show,
                "print the remembered decisions and the cache file path, then exit");
  app->add_flag("--json", tc->json, "with --show: print JSON");
  return {app, [tc](const std::vector<std::string>&) { return tune(*tc); }};
}

}  // namespace memeff::cli
