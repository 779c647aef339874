// `memeff bench`: times forward and backward on a list of shapes as ANCHORS.md's were measured
// (GPU: device-resident inputs, L2 flushed by a 256 MiB write before every timed call, CUDA
// events, medians) and writes rows with bench/torch_sdpa.py's keys, so a script can join the two.
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
#include "memeff/attention.h"
#include "memeff/error.h"

namespace memeff::cli {

namespace {

// The five anchor shapes of ANCHORS.md: B,H,Lq,Lk,D,causal.
const char* const kAnchorShapes[] = {"32,12,512,512,64,0", "8,16,2048,2048,128,0", "8,16,2048,2048,128,1",
                                     "4,32,4096,4096,64,1", "1,16,16384,16384,128,1"};
// The CPU shapes of ANCHORS.md (PyTorch's CPU SDPA was measured on these).
const char* const kCpuAnchorShapes[] = {"1,4,1024,1024,64,0", "1,8,2048,2048,64,0"};

// One --shapes entry: B,H,Lq,Lk,D,causal[,Hkv], the form of the PyTorch peer script, whose causal
// field is 0 or 1 (top_left, or bottom_right with --causal-align); Hkv < H is grouped-query
// attention.
struct BenchShape {
  ShapeConfig config;
  std::string text;
};

BenchShape parse_bench_shape(const std::string& text) {
  const std::size_t count = split(text, ',').size();
  if (count != 6 && count != 7) {
    throw UsageError("--shapes: expected B,H,Lq,Lk,D,causal[,Hkv] (causal 0 or 1), got `" + text + "`");
  }
  BenchShape s{ShapeConfig{}, text};
  ShapeConfig& c = s.config;
  std::string causal;
  CLI::App fields("one --shapes entry", "--shapes");
  fields.add_option("B", c.B)->transform(integer(1));
  fields.add_option("H", c.Hq)->transform(integer(1));
  fields.add_option("Lq", c.Lq)->transform(integer(1));
  fields.add_option("Lk", c.Lk)->transform(integer(1));
  fields.add_option("D", c.D)->transform(integer(1));
  add_name(fields, "causal", causal, {"0", "1"}, "");
  fields.add_option("Hkv", c.Hkv)->transform(integer(1));
  try {
    parse_fields(fields, text);
  } catch (const CLI::ParseError& e) {
    throw UsageError("--shapes `" + text + "`: " + e.what());
  }
  if (c.Hq % c.hkv() != 0) {
    throw UsageError("--shapes `" + text + "`: H = " + std::to_string(c.Hq) +
                     " is not a multiple of Hkv = " + std::to_string(c.hkv()));
  }
  c.causal = causal == "1" ? CausalMode::top_left : CausalMode::none;
  return s;
}

constexpr double kMiB = 1024.0 * 1024.0;

struct BenchConfig {
  std::vector<std::string> shapes;
  std::vector<double> dropouts;
  std::optional<DType> dtype;
  std::string backend, json_path;
  DeviceChoice device = DeviceChoice::automatic;
  std::int64_t warmup = -1, iters = -1;  // default: by device
  std::uint64_t seed = 0;
  bool deterministic = false;
  bool forward_only = false;  // time the forward alone (decode shapes)
  CausalMode causal_align = CausalMode::top_left;  // what a shape's causal 1 means
  BiasPattern bias;  // none by default
};

int bench(const BenchConfig& bc) {
  if (bc.causal_align == CausalMode::none) {
    throw UsageError("--causal-align: expected top_left or bottom_right, got none");
  }
  std::vector<BenchShape> shapes;
  for (const std::string& t : bc.shapes) shapes.push_back(parse_bench_shape(t));
  const std::vector<double> dropouts =
      bc.dropouts.empty() ? std::vector<double>{0.0, 0.1} : bc.dropouts;

  std::string note;
  const Device device = resolve_device(bc.device, &note);
  if (!note.empty()) std::fprintf(stderr, "memeff bench: %s\n", note.c_str());
  const bool gpu = device.type == DeviceType::cuda;
  if (bc.shapes.empty()) {
    if (gpu) {
      for (const char* t : kAnchorShapes) shapes.push_back(parse_bench_shape(t));
    } else {
      for (const char* t : kCpuAnchorShapes) shapes.push_back(parse_bench_shape(t));
    }
  }
  const std::int64_t warmup = bc.warmup >= 0 ? bc.warmup : gpu ? 5 : 1;
  const std::int64_t iters = bc.iters >= 0 ? bc.iters : gpu ? 20 : 3;
  const std::string where = device_description(device);
  std::printf("# memeff %s bench on %s (%s)\n", version(), where.c_str(), gpu ? "CUDA events, L2 flushed" : "wall clock");
  std::fflush(stdout);

  Options options;
  if (!bc.backend.empty()) options.backends = split(bc.backend, ',');
  options.deterministic = bc.deterministic;
  L2Flusher flusher(device);
  Timer timer(device);
  Json rows = Json::array();
  int failures = 0;
  const std::size_t total = shapes.size() * dropouts.size();
  std::size_t index = 0;
  for (const BenchShape& s : shapes) {
    for (double p_drop : dropouts) {
      ++index;
      ShapeConfig c = s.config;
      if (c.causal != CausalMode::none) c.causal = bc.causal_align;
      c.dropout = p_drop;
      c.seed = bc.seed;
      c.dtype = bc.dtype;
      c.bias = bc.bias;
      Json row = {{"B", c.B},
                  {"H", c.Hq},
                  {"Hkv", c.hkv()},
                  {"Lq", c.Lq},
                  {"Lk", c.lk()},
                  {"D", c.D},
                  {"causal", c.causal != CausalMode::none},
                  {"causal_mode", causal_mode_name(c.causal)},
                  {"dropout", p_drop},
                  {"bias", c.bias.text()},
                  {"dtype", dtype_name(c.dtype_on(device.type))}};
      char label[96];
      std::snprintf(label, sizeof label, "%-24s p=%-4g", s.text.c_str(), p_drop);
      std::fprintf(stderr, "memeff bench: [%zu/%zu] %s: preparing inputs\n", index, total, label);
      try {
        const AttentionData d = make_attention_data(c, device);
        const AttentionArgs args = d.args();
        const BackwardTensors grads = d.grads();
        const Buffer ws_f(device, workspace_size(args, Pass::forward, options));
        const Buffer ws_b(device,
                          bc.forward_only ? 0 : workspace_size(args, Pass::backward, options));
        const Options fo = with_workspace(options, ws_f), bo = with_workspace(options, ws_b);

        synchronize(device);
        const std::size_t free_before = device_free_bytes(device);
        const CallInfo fi = forward(args, grads.out, grads.lse, fo);
        const CallInfo bi = bc.forward_only ? CallInfo{} : backward(args, grads, bo);
        synchronize(device);
        const std::size_t free_after = device_free_bytes(device);
        const double drop_mib = free_before > free_after ? static_cast<double>(free_before - free_after) / kMiB : 0.0;
        std::fprintf(stderr, "memeff bench: [%zu/%zu] %s: %s, warm-up and %lld timed calls per pass\n", index, total,
                     label, fi.backend.c_str(), static_cast<long long>(iters));
        for (std::int64_t i = 0; i < warmup; ++i) {
          forward(args, grads.out, grads.lse, fo);
          if (!bc.forward_only) backward(args, grads, bo);
        }
        std::vector<double> tf, tb;
        for (std::int64_t i = 0; i < iters; ++i) {
          flusher.flush();
          timer.start();
          forward(args, grads.out, grads.lse, fo);
          tf.push_back(timer.stop());
        }
        for (std::int64_t i = 0; i < iters && !bc.forward_only; ++i) {
          flusher.flush();
          timer.start();
          backward(args, grads, bo);
          tb.push_back(timer.stop());
        }
        synchronize(device);
        const PassRates rates(d.forward_flops(), median(tf), median(tb));
        const double outputs = static_cast<double>(d.out.bytes() + d.lse.bytes() + d.dq.bytes() + d.dk.bytes() +
                                                   d.dv.bytes());
        const double extra =
            (outputs + static_cast<double>(ws_f.bytes() + ws_b.bytes())) / kMiB + drop_mib;
        row["backend"] = fi.backend;
        add_rates_json(row, rates, "fwdbwd_tflops");
        row["extra_mib"] = extra;
        row["backend_backward"] = bi.backend;
        row["p_effective"] = fi.p_effective;
        row["workspace_fwd_mib"] = static_cast<double>(ws_f.bytes()) / kMiB;
        row["workspace_bwd_mib"] = static_cast<double>(ws_b.bytes()) / kMiB;
        row["memgetinfo_drop_mib"] = drop_mib;
        row["iters"] = iters;
        row["library"] = "memeff";
        row["deterministic"] = bc.deterministic;
        std::printf(
            "%s %-10s fwd %8.3f ms %7.3g  bwd %8.3f ms %7.3g  fwd+bwd %7.3g TFLOP/s  extra %8.1f "
            "MiB\n",
            label, fi.backend.c_str(), rates.fwd_ms, rates.fwd_tflops, rates.bwd_ms,
            rates.bwd_tflops, rates.fwdbwd_tflops, extra);
      } catch (const Error& e) {
        ++failures;
        std::string first_line = e.what();
        first_line = first_line.substr(0, first_line.find('\n'));
        row["backend"] = bc.backend.empty() ? "memeff" : bc.backend;
        row["error"] = first_line;
        row["library"] = "memeff";
        std::printf("%s unsupported or failed: %s\n", label, first_line.c_str());
      }
      std::fflush(stdout);
      rows.push_back(std::move(row));
    }
  }
  if (!bc.json_path.empty()) {
    std::ofstream out(bc.json_path);
    if (!out) {
      throw Error(ErrorCode::io_error, "--json: cannot open `" + bc.json_path + "` for writing");
    }
    const Json doc = {{"gpu", where}, {"memeff", version()}, {"rows", rows}};
    out << json_text(doc, 1) << "\n";
    if (!out) throw Error(ErrorCode::io_error, "--json: writing `" + bc.json_path + "` failed");
  }
  return failures ? 1 : 0;  // the JSON and every other row are still written
}

}  // namespace

Command add_bench_command(CLI::App& program) {
  auto bc = std::make_shared<BenchConfig>();
  CLI::App* app = program.add_subcommand(
      "bench", R"(benchmark forward/backward on a list of shapes (GPU: CUDA events, L2 flushed)

Benchmarks memeff forward and backward on a list of shapes, as PyTorch's SDPA backends are
measured in ANCHORS.md (bench/torch_sdpa.py). FLOPs: )" +
                   flops_help() + R"(,
causal is top_left. GPU: inputs in device memory, L2 flushed before each timed call, CUDA
events, median. Progress on stderr, one line per row on stdout.
)");
  app->add_option(
         "--shapes", bc->shapes,
         "shapes B,H,Lq,Lk,D,causal[,Hkv] (causal 0 or 1, aligned by --causal-align;\n"
         "Hkv < H: grouped-query attention;\n"
         "default on cuda: the five anchor shapes of ANCHORS.md,\n"
         "32,12,512,512,64,0 8,16,2048,2048,128,0 8,16,2048,2048,128,1 4,32,4096,4096,64,1\n"
         "1,16,16384,16384,128,1; on cpu: ANCHORS.md's CPU shapes 1,4,1024,1024,64,0 "
         "1,8,2048,2048,64,0)")
      ->type_name("S");
  add_checked(*app, "--dropout", bc->dropouts, "P", probability(),
              "dropout probabilities (default 0 0.1)");
  add_dtype(*app, "--dtype", bc->dtype, "element type (default bf16 on cuda, fp32 on cpu)");
  app->add_option("--backend", bc->backend,
                  "comma-separated allow-list (Options::backends; default: the dispatcher's order)")
      ->type_name("LIST");
  add_device(*app, bc->device, "default auto");
  add_checked(*app, "--warmup", bc->warmup, "N", integer(0),
              "untimed forward+backward calls per row (default 5 on cuda, 1 on cpu)");
  add_checked(*app, "--iters", bc->iters, "N", integer(1),
              "timed calls per pass; the median is reported (default 20 on cuda, 3 on cpu)");
  add_checked(*app, "--seed", bc->seed, "S", unsigned64(),
              "dropout seed and input seed (default 0)");
  add_value(*app, "--bias", bc->bias, BiasPattern::from_text,
            "none, full or a pattern over [B, H, Lq, Lk] such as 1hqk or b11k", "PATTERN",
            "an additive bias on every row: none (default), full (= bhqk) or a broadcast pattern\n"
            "over [B,H,Lq,Lk] (a 1 marks a broadcast dim, e.g. b11k, 11qk); dbias is computed");
  add_causal(*app, "--causal-align", bc->causal_align,
             "the causal mask of shapes with causal 1: top_left (default, as PyTorch's is_causal) or\n"
             "bottom_right (decode and chunked prefill: the last query sees every key)");
  app->add_flag("--forward-only", bc->forward_only,
                "time the forward alone (decode shapes; bwd_ms is then 0)");
  app->add_flag("--deterministic", bc->deterministic,
                "time the bitwise-repeatable backward (Options::deterministic)");
  app->add_option("--json", bc->json_path,
                  "write {\"gpu\", \"memeff\", \"rows\": [...]} with torch_sdpa.py's row keys: B H "
                  "Lq Lk D causal\n"
                  "dropout dtype backend fwd_ms bwd_ms fwd_tflops bwd_tflops fwdbwd_tflops "
                  "extra_mib (+ extras)")
      ->type_name("FILE");
  app->footer(
      R"(extra_mib: device memory a forward+backward needs beyond q, k, v and dout: out, lse, dq, dk, dv,
the workspace each pass asks for (workspace_size), and any drop of cudaMemGetInfo across the first
calls (memory a backend allocated itself; reported separately as memgetinfo_drop_mib).)");
  return {app, [bc](const std::vector<std::string>&) { return bench(*bc); }};
}

}  // namespace memeff::cli
