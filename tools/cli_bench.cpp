// `memeff bench`: times forward and backward on a list of shapes, the way the anchors in
// ANCHORS.md were measured, and writes rows with the same keys as bench/torch_sdpa.py so a
// script can join the two. GPU: device-resident inputs, the L2 flushed before every timed call
// (a 256 MiB write, outside the timed region), CUDA events, warm-up, median. CPU: wall clock.
#include <cstdio>
#include <fstream>
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

struct BenchShape {
  std::int64_t B, H, Lq, Lk, D, Hkv;
  bool causal;
  std::string text;
};

BenchShape parse_bench_shape(const std::string& text) {
  const std::vector<std::string> f = split(text, ',');
  if (f.size() != 6 && f.size() != 7) {
    throw UsageError("--shapes: expected B,H,Lq,Lk,D,causal[,Hkv] (causal 0 or 1), got `" + text + "`");
  }
  BenchShape s;
  s.B = parse_int("--shapes (B)", f[0], 1);
  s.H = parse_int("--shapes (H)", f[1], 1);
  s.Lq = parse_int("--shapes (Lq)", f[2], 1);
  s.Lk = parse_int("--shapes (Lk)", f[3], 1);
  s.D = parse_int("--shapes (D)", f[4], 1);
  if (f[5] != "0" && f[5] != "1") throw UsageError("--shapes (causal): expected 0 or 1, got `" + f[5] + "`");
  s.causal = f[5] == "1";
  s.Hkv = f.size() == 7 ? parse_int("--shapes (Hkv)", f[6], 1) : s.H;
  if (s.H % s.Hkv != 0) {
    throw UsageError("--shapes (Hkv): H = " + f[1] + " is not a multiple of Hkv = " + f[6]);
  }
  s.text = text;
  return s;
}

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

int bench_command(const std::vector<std::string>& argv) {
  std::vector<std::string> shape_texts;
  std::vector<double> dropouts;
  std::optional<DType> dtype;
  std::string backend, json_path;
  DeviceChoice device_choice = DeviceChoice::automatic;
  std::int64_t warmup = -1, iters = -1;
  std::uint64_t seed = 0;
  bool deterministic = false;
  FlagParser p("memeff bench",
               "Benchmarks memeff forward and backward on a list of shapes, as PyTorch's SDPA backends are\n"
               "measured in ANCHORS.md (bench/torch_sdpa.py): FLOPs 4*B*H*Lq*Lk*D (halved when causal, causal\n"
               "is top-left), backward 2.5x. GPU: inputs in device memory, L2 flushed before each timed call,\n"
               "CUDA events, median. Progress on stderr, one line per row on stdout.");
  p.add({"--shapes", "S...",
         "shapes B,H,Lq,Lk,D,causal[,Hkv] (Hkv < H: grouped-query attention; default on cuda: the five anchor shapes of ANCHORS.md,\n"
         "32,12,512,512,64,0 8,16,2048,2048,128,0 8,16,2048,2048,128,1 4,32,4096,4096,64,1\n"
         "1,16,16384,16384,128,1; on cpu: ANCHORS.md's CPU shapes 1,4,1024,1024,64,0 1,8,2048,2048,64,0)",
         [&](const std::string& v) { shape_texts.push_back(v); }, true});
  p.add({"--dropout", "P...", "dropout probabilities (default 0 0.1)",
         [&](const std::string& v) { dropouts.push_back(parse_probability("--dropout", v)); }, true});
  p.add({"--dtype", "T", "fp16, bf16 or fp32 (default bf16 on cuda, fp32 on cpu)",
         [&](const std::string& v) { dtype = parse_dtype("--dtype", v); }});
  p.add({"--backend", "LIST", "comma-separated allow-list (Options::backends; default: the dispatcher's order)",
         [&](const std::string& v) { backend = v; }});
  p.add({"--device", "DEV", "cpu, cuda or auto (default auto)",
         [&](const std::string& v) { device_choice = parse_device("--device", v); }});
  p.add({"--warmup", "N", "untimed forward+backward calls per row (default 5 on cuda, 1 on cpu)",
         [&](const std::string& v) { warmup = parse_int("--warmup", v, 0); }});
  p.add({"--iters", "N", "timed calls per pass; the median is reported (default 20 on cuda, 3 on cpu)",
         [&](const std::string& v) { iters = parse_int("--iters", v, 1); }});
  p.add({"--seed", "S", "dropout seed and input seed (default 0)", [&](const std::string& v) { seed = parse_u64("--seed", v); }});
  p.add({"--deterministic", "", "time the bitwise-repeatable backward (Options::deterministic)",
         [&](const std::string&) { deterministic = true; }});
  p.add({"--json", "FILE",
         "write {\"gpu\", \"memeff\", \"rows\": [...]} with torch_sdpa.py's row keys: B H Lq Lk D causal\n"
         "dropout dtype backend fwd_ms bwd_ms fwd_tflops bwd_tflops fwdbwd_tflops extra_mib (+ extras)",
         [&](const std::string& v) { json_path = v; }});
  p.add_section(
      "extra_mib: device memory a forward+backward needs beyond q, k, v and dout: out, lse, dq, dk, dv,\n"
      "the workspace each pass asks for (workspace_size), and any drop of cudaMemGetInfo across the first\n"
      "calls (memory a backend allocated itself; reported separately as memgetinfo_drop_mib).");
  p.parse(argv);

  std::vector<BenchShape> shapes;
  for (const std::string& t : shape_texts) shapes.push_back(parse_bench_shape(t));
  if (dropouts.empty()) dropouts = {0.0, 0.1};

  std::string note;
  const Device device = resolve_device(device_choice, &note);
  if (!note.empty()) std::fprintf(stderr, "memeff bench: %s\n", note.c_str());
  const bool gpu = device.type == DeviceType::cuda;
  if (shape_texts.empty()) {
    if (gpu) {
      for (const char* t : kAnchorShapes) shapes.push_back(parse_bench_shape(t));
    } else {
      for (const char* t : kCpuAnchorShapes) shapes.push_back(parse_bench_shape(t));
    }
  }
  if (warmup < 0) warmup = gpu ? 5 : 1;
  if (iters < 0) iters = gpu ? 20 : 3;
  const std::string where = device_description(device);
  std::printf("# memeff %s bench on %s (%s)\n", version(), where.c_str(), gpu ? "CUDA events, L2 flushed" : "wall clock");
  std::fflush(stdout);

  Options options;
  if (!backend.empty()) options.backends = split(backend, ',');
  options.deterministic = deterministic;
  L2Flusher flusher(device);
  Timer timer(device);
  Json rows = Json::array();
  int failures = 0;
  const std::size_t total = shapes.size() * dropouts.size();
  std::size_t index = 0;
  for (const BenchShape& s : shapes) {
    for (double p_drop : dropouts) {
      ++index;
      ShapeConfig c;
      c.B = s.B;
      c.Hq = s.H;
      c.Hkv = s.Hkv;
      c.Lq = s.Lq;
      c.Lk = s.Lk;
      c.D = s.D;
      c.causal = s.causal ? CausalMode::top_left : CausalMode::none;
      c.dropout = p_drop;
      c.seed = seed;
      c.dtype = dtype;
      const DType dt = c.dtype_on(device.type);
      Json row = {{"B", s.B},       {"H", s.H},           {"Hkv", s.Hkv},
                  {"Lq", s.Lq},     {"Lk", s.Lk},         {"D", s.D},
                  {"causal", s.causal}, {"dropout", p_drop}, {"dtype", dtype_name(dt)}};
      char label[96];
      std::snprintf(label, sizeof label, "%-24s p=%-4g", s.text.c_str(), p_drop);
      std::fprintf(stderr, "memeff bench: [%zu/%zu] %s: preparing inputs\n", index, total, label);
      try {
        AttentionData d = make_attention_data(c, device);
        const AttentionArgs args = d.args();
        const BackwardTensors grads = d.grads();
        const std::size_t ws_f = workspace_size(args, Pass::forward, options);
        const std::size_t ws_b = workspace_size(args, Pass::backward, options);
        Buffer wsf(device, ws_f), wsb(device, ws_b);
        Options fo = options, bo = options;
        fo.workspace = wsf.data();
        fo.workspace_bytes = ws_f;
        bo.workspace = wsb.data();
        bo.workspace_bytes = ws_b;

        synchronize(device);
        const std::size_t free_before = device_free_bytes(device);
        const CallInfo fi = forward(args, grads.out, grads.lse, fo);
        const CallInfo bi = backward(args, grads, bo);
        synchronize(device);
        const std::size_t free_after = device_free_bytes(device);
        const double drop_mib = free_before > free_after ? static_cast<double>(free_before - free_after) / kMiB : 0.0;
        std::fprintf(stderr, "memeff bench: [%zu/%zu] %s: %s, warm-up and %lld timed calls per pass\n", index, total,
                     label, fi.backend.c_str(), static_cast<long long>(iters));
        for (std::int64_t i = 0; i < warmup; ++i) {
          forward(args, grads.out, grads.lse, fo);
          backward(args, grads, bo);
        }
        std::vector<double> tf, tb;
        for (std::int64_t i = 0; i < iters; ++i) {
          flusher.flush();
          timer.start();
          forward(args, grads.out, grads.lse, fo);
          tf.push_back(timer.stop());
        }
        for (std::int64_t i = 0; i < iters; ++i) {
          flusher.flush();
          timer.start();
          backward(args, grads, bo);
          tb.push_back(timer.stop());
        }
        synchronize(device);
        const double t_f = median(tf), t_b = median(tb), flops = d.forward_flops();
        const double outputs = static_cast<double>(d.out.bytes() + d.lse.bytes() + d.dq.bytes() + d.dk.bytes() +
                                                   d.dv.bytes());
        const double extra = (outputs + static_cast<double>(ws_f + ws_b)) / kMiB + drop_mib;
        const double f_tf = flops / t_f / 1e9, b_tf = 2.5 * flops / t_b / 1e9, fb_tf = 3.5 * flops / (t_f + t_b) / 1e9;
        row["backend"] = fi.backend;
        row["fwd_ms"] = t_f;
        row["bwd_ms"] = t_b;
        row["fwd_tflops"] = f_tf;
        row["bwd_tflops"] = b_tf;
        row["fwdbwd_tflops"] = fb_tf;
        row["extra_mib"] = extra;
        row["backend_backward"] = bi.backend;
        row["p_effective"] = fi.p_effective;
        row["workspace_fwd_mib"] = static_cast<double>(ws_f) / kMiB;
        row["workspace_bwd_mib"] = static_cast<double>(ws_b) / kMiB;
        row["memgetinfo_drop_mib"] = drop_mib;
        row["iters"] = iters;
        row["library"] = "memeff";
        row["deterministic"] = deterministic;
        std::printf("%s %-10s fwd %8.3f ms %7.3g  bwd %8.3f ms %7.3g  fwd+bwd %7.3g TFLOP/s  extra %8.1f MiB\n", label,
                    fi.backend.c_str(), t_f, f_tf, t_b, b_tf, fb_tf, extra);
      } catch (const Error& e) {
        ++failures;
        std::string first_line = e.what();
        first_line = first_line.substr(0, first_line.find('\n'));
        row["backend"] = backend.empty() ? "memeff" : backend;
        row["error"] = first_line;
        row["library"] = "memeff";
        std::printf("%s unsupported or failed: %s\n", label, first_line.c_str());
      }
      std::fflush(stdout);
      rows.push_back(std::move(row));
    }
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    if (!out) throw Error(ErrorCode::io_error, "--json: cannot open `" + json_path + "` for writing");
    const Json doc = {{"gpu", where}, {"memeff", version()}, {"rows", rows}};
    out << json_text(doc, 1) << "\n";
    if (!out) throw Error(ErrorCode::io_error, "--json: writing `" + json_path + "` failed");
  }
  return failures ? 1 : 0;  // the JSON and every other row are still written
}

}  // namespace memeff::cli
