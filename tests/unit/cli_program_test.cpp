// Tests of the memeff program (tools/cli_*.cpp, linked as memeff_cli_lib): the options name the
// flag they reject and take the library's one spelling of each causal mode and dtype; bad
// command lines exit with 2; `memeff run` fails (exit 1) when a backend's output is wrong,
// including through the sampled check; `memeff mask` writes exactly memeff::dropout_keep.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli_args.h"
#include "cli_commands.h"
#include "cli_problem.h"
#include "memeff/backend.h"
#include "memeff/dropout.h"

namespace memeff::cli {
namespace {

int run_program(std::vector<std::string> args) {
  args.insert(args.begin(), "memeff");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return main_program(static_cast<int>(argv.size()), argv.data());
}

// The exit status and what the program wrote on stderr.
struct Outcome {
  int rc = -1;
  std::string err;
};
Outcome run_captured(std::vector<std::string> args) {
  ::testing::internal::CaptureStderr();
  Outcome o;
  o.rc = run_program(std::move(args));
  o.err = ::testing::internal::GetCapturedStderr();
  return o;
}

// The message of parsing `args` with `app` (a CLI::ParseError, UsageError included), or "" when
// they parse.
std::string parse_error(CLI::App& app, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app.parse(std::move(args));
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

// The shape flags of `memeff run` on an app of their own.
struct ShapeFlags {
  ShapeConfig config;
  CLI::App app{"shape flags", "test"};
  ShapeFlags() { add_shape_flags(app, config); }
  std::string parse(std::vector<std::string> args) { return parse_error(app, std::move(args)); }
};

// The UsageError message of `fn`, or "" when it does not throw one.
template <class Fn>
std::string usage_error(Fn&& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("memeff_cli_test_" + std::to_string(::getpid()) + "_" + name);
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CliParse, BiasPatterns) {
  const BiasPattern none = BiasPattern::from_text("none").value();
  EXPECT_FALSE(none.present);
  const BiasPattern full = BiasPattern::from_text("full").value();
  EXPECT_TRUE(full.present);
  EXPECT_FALSE(full.bcast_b || full.bcast_h || full.bcast_q);
  EXPECT_EQ(full.text(), "bhqk");
  const BiasPattern p = BiasPattern::from_text("1hqk").value();
  EXPECT_TRUE(p.bcast_b);
  EXPECT_FALSE(p.bcast_h);
  EXPECT_FALSE(p.bcast_q);
  const BiasPattern r = BiasPattern::from_text("b11k").value();
  EXPECT_FALSE(r.bcast_b);
  EXPECT_TRUE(r.bcast_h && r.bcast_q);
  EXPECT_EQ(r.text(), "b11k");
  for (const char* bad : {"bhq1", "xhqk", "bhqkk", "", "1111", "hbqk"}) {
    EXPECT_FALSE(BiasPattern::from_text(bad)) << bad;
    ShapeFlags f;
    EXPECT_TRUE(contains(f.parse({"--bias", bad}), "--bias: expected none, full or a pattern"))
        << bad;
  }
}

TEST(CliParse, ValuesNameTheFlag) {
  ShapeFlags f;
  ASSERT_EQ(f.parse({"--lq", "129", "--lk=010", "--seed", "18446744073709551615", "--offset",
                     "0x10", "--dropout", "0.25", "--scale", "0.5"}),
            "");
  EXPECT_EQ(f.config.Lq, 129);
  EXPECT_EQ(f.config.lk(), 10);  // decimal, not octal
  EXPECT_EQ(f.config.seed, 18446744073709551615ull);
  EXPECT_EQ(f.config.offset, 16u);
  EXPECT_DOUBLE_EQ(f.config.dropout, 0.25);
  EXPECT_DOUBLE_EQ(f.config.scale.value(), 0.5);
  EXPECT_EQ(ShapeFlags().parse({"--lq", "12x"}), "--lq: expected an integer, got `12x`");
  EXPECT_EQ(ShapeFlags().parse({"--heads", "0"}), "--heads: expected an integer >= 1, got 0");
  EXPECT_TRUE(contains(ShapeFlags().parse({"--seed", "-1"}),
                       "--seed: expected an unsigned 64-bit integer"));
  EXPECT_TRUE(contains(ShapeFlags().parse({"--dropout", "1"}),
                       "--dropout: expected a probability in [0, 1)"));
  EXPECT_TRUE(
      contains(ShapeFlags().parse({"--scale", "nan"}), "--scale: expected a finite number"));
  const std::optional<IndexRange> r = IndexRange::from_text("3:10");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->begin, 3);
  EXPECT_EQ(r->end, 10);
  EXPECT_EQ(IndexRange::from_text("4").value().size(), 1);
  for (const char* bad : {"9:3", "-1", "1:x", ""}) EXPECT_FALSE(IndexRange::from_text(bad)) << bad;
  EXPECT_EQ(lengths_from_text("3,0,17").value(), (std::vector<std::int64_t>{3, 0, 17}));
  EXPECT_FALSE(lengths_from_text("3,-1"));
}

// --window LEFT,RIGHT, --alibi and --softcap C (docs/window.md): values and the errors that name
// the flag.
TEST(CliParse, WindowAlibiAndSoftcapFlags) {
  ShapeFlags f;
  ASSERT_EQ(f.parse({"--window", "37,5", "--alibi", "--softcap", "30"}), "");
  EXPECT_EQ(f.config.window, (Window{37, 5}));
  EXPECT_TRUE(f.config.alibi);
  EXPECT_DOUBLE_EQ(f.config.softcap, 30.0);
  EXPECT_TRUE(contains(f.config.describe(DType::f32), "window=37,5 alibi softcap=30"));
  EXPECT_EQ(window_from_text("-1,0").value(), (Window{-1, 0}));
  for (const char* bad : {"3", "a,1", "-2,0", "1,2,3", "1,", ""}) {
    EXPECT_FALSE(window_from_text(bad)) << bad;
    EXPECT_TRUE(contains(ShapeFlags().parse({"--window", bad}), "--window: expected LEFT,RIGHT"))
        << bad;
  }
  EXPECT_TRUE(
      contains(ShapeFlags().parse({"--softcap", "inf"}), "--softcap: expected a finite number"));
  ShapeFlags negative;
  ASSERT_EQ(negative.parse({"--softcap", "-2"}), "");
  EXPECT_TRUE(contains(usage_error([&] { negative.config.check(); }), "--softcap: expected"));
}

// ALiBi's standard slopes: 2^(-8(h+1)/H) for a power of two, the interleaved extension otherwise.
TEST(CliParse, AlibiSlopesAreTheStandardOnes) {
  const std::vector<float> eight = alibi_slopes(8);
  ASSERT_EQ(eight.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(eight[h], std::exp2(-(h + 1.0f))) << h;
  EXPECT_EQ(alibi_slopes(6),
            (std::vector<float>{0x1p-2f, 0x1p-4f, 0x1p-6f, 0x1p-8f, 0x1p-1f, 0x1p-3f}));
  EXPECT_EQ(alibi_slopes(1), (std::vector<float>{0x1p-8f}));
}

// The program spells every causal mode and dtype as the library does, and nothing else.
TEST(CliParse, EnumsTakeTheLibrarysSpellingOnly) {
  for (CausalMode m : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    ShapeFlags f;
    f.config.causal = m == CausalMode::none ? CausalMode::top_left : CausalMode::none;
    ASSERT_EQ(f.parse({"--causal", causal_mode_name(m)}), "") << causal_mode_name(m);
    EXPECT_EQ(f.config.causal, m) << causal_mode_name(m);
  }
  for (const char* old : {"top-left", "bottom-right", "0", "1", "2", "causal", ""}) {
    EXPECT_EQ(ShapeFlags().parse({"--causal", old}),
              std::string("--causal: expected none, top_left or bottom_right, got `") + old + "`");
  }
  for (DType d : {DType::f32, DType::f16, DType::bf16}) {
    ShapeFlags f;
    ASSERT_EQ(f.parse({"--dtype", dtype_name(d)}), "") << dtype_name(d);
    EXPECT_EQ(f.config.dtype, d) << dtype_name(d);
  }
  for (const char* refused : {"float32", "f32", "bfloat16", "fp64", "int32"}) {
    EXPECT_EQ(ShapeFlags().parse({"--dtype", refused}),
              std::string("--dtype: expected fp32, fp16 or bf16, got `") + refused + "`");
  }
  ShapeConfig c;
  c.causal = CausalMode::bottom_right;
  EXPECT_TRUE(contains(c.describe(DType::bf16), "bf16 causal=bottom_right"))
      << c.describe(DType::bf16);
}

TEST(CliParse, CommandLineForms) {
  // --flag=value, several values after one flag, and negative numbers as values.
  ShapeFlags f;
  EXPECT_EQ(f.parse({"--batch=3", "--heads", "6", "--kv-heads=3"}), "");
  EXPECT_EQ(f.config.B, 3);
  EXPECT_EQ(f.config.hkv(), 3);
  EXPECT_EQ(ShapeFlags().parse({"--lq"}), "--lq: 1 required N missing");
  EXPECT_TRUE(contains(ShapeFlags().parse({"--bogus"}), "--bogus"));

  const Outcome bogus = run_captured({"run", "--bogus=3"});
  EXPECT_EQ(bogus.rc, 2);
  EXPECT_TRUE(contains(bogus.err, "`memeff run`: unknown flag `--bogus` (see `memeff run --help`)"))
      << bogus.err;
  const Outcome stray = run_captured({"mask", "--lq", "8", "stray"});
  EXPECT_EQ(stray.rc, 2);
  EXPECT_TRUE(contains(stray.err, "`memeff mask`: unexpected argument `stray`")) << stray.err;
  const Outcome causal = run_captured({"run", "--causal", "bottom-right"});
  EXPECT_EQ(causal.rc, 2);
  EXPECT_TRUE(
      contains(causal.err, "--causal: expected none, top_left or bottom_right, got `bottom-right`"))
      << causal.err;
  const Outcome format = run_captured({"mask", "--format", "png"});
  EXPECT_EQ(format.rc, 2);
  EXPECT_TRUE(contains(format.err, "--format: expected text, bits or npy, got `png`"))
      << format.err;
  const Outcome check = run_captured({"run", "--check", "0"});
  EXPECT_EQ(check.rc, 2);
  EXPECT_TRUE(contains(check.err, "--check: expected auto, full, none or a number of heads >= 1"))
      << check.err;
}

TEST(CliParse, ShapeLines) {
  const ShapeConfig c = parse_shape_line("2,8,2,128,256,64,32,bottom_right,0.2,bf16", "f:1");
  EXPECT_EQ(c.B, 2);
  EXPECT_EQ(c.Hq, 8);
  EXPECT_EQ(c.hkv(), 2);
  EXPECT_EQ(c.Lq, 128);
  EXPECT_EQ(c.lk(), 256);
  EXPECT_EQ(c.D, 64);
  EXPECT_EQ(c.dv(), 32);
  EXPECT_EQ(c.causal, CausalMode::bottom_right);
  EXPECT_DOUBLE_EQ(c.dropout, 0.2);
  EXPECT_EQ(c.dtype_on(DeviceType::cpu), DType::bf16);
  const ShapeConfig short_form = parse_shape_line("1,4,4,64,64,32", "f:2");
  EXPECT_EQ(short_form.dv(), 32);
  EXPECT_EQ(short_form.causal, CausalMode::top_left);  // the run defaults
  EXPECT_EQ(parse_shape_line("1,4,4,64,64,32,32,none", "f:2").causal, CausalMode::none);
  const ShapeConfig flags = parse_shape_line("  --batch 3 --heads 6 --kv-heads 3 --lq 17 --bias 1hqk ", "f:3");
  EXPECT_EQ(flags.B, 3);
  EXPECT_EQ(flags.hkv(), 3);
  EXPECT_EQ(flags.lk(), 17);
  EXPECT_TRUE(flags.bias.present && flags.bias.bcast_b);
  EXPECT_TRUE(contains(usage_error([] { parse_shape_line("1,4,3,64,64,32", "shapes.txt:7"); }),
                       "shapes.txt:7"));
  EXPECT_TRUE(
      contains(usage_error([] { parse_shape_line("1,4,4", "shapes.txt:8"); }), "shapes.txt:8"));
  EXPECT_TRUE(contains(usage_error([] { parse_shape_line("--bogus 3", "s:9"); }), "--bogus"));
  EXPECT_TRUE(contains(usage_error([] { parse_shape_line("--help", "s:10"); }), "s:10"));
  // The compact form's causal and dtype fields take the same spellings as the flags.
  EXPECT_EQ(usage_error([] { parse_shape_line("1,4,4,64,64,32,32,1", "s:11"); }),
            "s:11: causal: expected none, top_left or bottom_right, got `1`");
  EXPECT_EQ(usage_error([] { parse_shape_line("1,4,4,64,64,32,32,top-left", "s:12"); }),
            "s:12: causal: expected none, top_left or bottom_right, got `top-left`");
  EXPECT_EQ(usage_error([] { parse_shape_line("1,4,4,64,64,32,32,none,0,float32", "s:13"); }),
            "s:13: dtype: expected fp32, fp16 or bf16, got `float32`");
  EXPECT_EQ(usage_error([] { parse_shape_line("1,0,4,64,64,32", "s:14"); }),
            "s:14: Hq: expected an integer >= 1, got 0");
}

TEST(CliProgram, BadCommandLinesExitWith2) {
  EXPECT_EQ(run_program({}), 2);
  EXPECT_EQ(run_program({"frobnicate"}), 2);
  EXPECT_EQ(run_program({"run", "--bogus"}), 2);
  EXPECT_EQ(run_program({"run", "--batch", "two"}), 2);
  EXPECT_EQ(run_program({"run", "--causal", "sideways"}), 2);
  EXPECT_EQ(run_program({"run", "--heads", "6", "--kv-heads", "4"}), 2);
  EXPECT_EQ(run_program({"run", "--context-parallel", "4097"}), 2);
  EXPECT_EQ(run_program({"mask", "--lq", "8", "--rows", "2:9"}), 2);
  EXPECT_EQ(run_program({"explain", "--pass", "fwd"}), 2);
  EXPECT_EQ(run_program({"bench", "--shapes", "1,2,3"}), 2);
  EXPECT_EQ(run_program({"tune"}), 2);
}

// `memeff bench --shapes` keeps the PyTorch peer script's numeric causal field: 1 is top_left, 0
// none, anything else (a mode's name included) is refused.
TEST(CliProgram, BenchShapesTakeThePeerScriptsCausalField) {
  const Outcome named =
      run_captured({"bench", "--device", "cpu", "--shapes", "1,1,8,8,8,top_left"});
  EXPECT_EQ(named.rc, 2);
  EXPECT_TRUE(
      contains(named.err, "--shapes `1,1,8,8,8,top_left`: causal: expected 0 or 1, got `top_left`"))
      << named.err;
  EXPECT_EQ(run_program({"bench", "--device", "cpu", "--shapes", "1,1,8,8,8,2"}), 2);
  // 4 query heads over 3 key/value heads.
  EXPECT_EQ(run_program({"bench", "--device", "cpu", "--shapes", "1,4,8,8,8,0,3"}), 2);

  const auto path = temp_file("bench.json");
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int rc = run_program({"bench", "--device", "cpu", "--shapes", "1,2,40,40,16,1",
                              "1,2,40,40,16,0,1", "--dropout", "0", "0.2", "--iters", "1",
                              "--warmup", "0", "--json", path.string()});
  const std::string out = ::testing::internal::GetCapturedStdout();
  ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(rc, 0) << out;
  const nlohmann::json doc = nlohmann::json::parse(read_file(path));
  const auto& rows = doc.at("rows");
  ASSERT_EQ(rows.size(), 4u) << doc;  // two shapes times two dropouts
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    EXPECT_EQ(row.at("causal"), i < 2) << row;
    EXPECT_EQ(row.at("Hkv"), i < 2 ? 2 : 1) << row;
    EXPECT_EQ(row.at("dropout"), i % 2 ? 0.2 : 0.0) << row;
    // The rates count the forward's FLOPs times pass_flop_factor and training_flop_factor.
    const double fwd_flops = row.at("fwd_tflops").get<double>() * row.at("fwd_ms").get<double>();
    const double bwd_flops = row.at("bwd_tflops").get<double>() * row.at("bwd_ms").get<double>();
    const double both_flops = row.at("fwdbwd_tflops").get<double>() *
                              (row.at("fwd_ms").get<double>() + row.at("bwd_ms").get<double>());
    EXPECT_NEAR(fwd_flops * 1e9,
                attention_flops(1, 2, 40, 40, 16, i < 2 ? CausalMode::top_left : CausalMode::none),
                1e-6 * fwd_flops * 1e9)
        << row;
    EXPECT_NEAR(bwd_flops, pass_flop_factor(Pass::backward) * fwd_flops, 1e-9 * bwd_flops) << row;
    EXPECT_NEAR(both_flops, training_flop_factor() * fwd_flops, 1e-9 * both_flops) << row;
  }
  std::filesystem::remove(path);
}

// A CPU backend that runs the reference and then corrupts one element of one output, to show
// that `memeff run` catches a wrong backend.
class CorruptingBackend final : public Backend {
 public:
  enum class Target { none, out, dk, dbias };
  explicit CorruptingBackend(Target target) : target_(target), reference_(find_backend("reference")) {}
  std::string name() const override { return "cli_test_corrupting"; }
  DeviceType device_type() const override { return DeviceType::cpu; }
  std::vector<std::string> reasons_unsupported(const Problem&, Pass) const override { return {}; }
  void forward(const Problem& pb, const AttentionArgs& args, const TensorView& out, const TensorView& lse,
               const Options& o) override {
    reference_->forward(pb, args, out, lse, o);
    if (target_ == Target::out) bump(out, out.offset(0, out.shape[1] - 1, out.shape[2] / 2, 1));
  }
  void backward(const Problem& pb, const AttentionArgs& args, const BackwardTensors& g, const Options& o) override {
    reference_->backward(pb, args, g, o);
    if (target_ == Target::dk) bump(g.dk, g.dk.offset(0, 0, g.dk.shape[2] - 1, 0));
    if (target_ == Target::dbias && g.dbias) bump(*g.dbias, g.dbias->offset(0, 0, 0, 3));
  }

 private:
  static void bump(const TensorView& t, std::int64_t offset) {
    ASSERT_EQ(t.dtype, DType::f32);
    static_cast<float*>(t.data)[offset] += 0.5f;
  }
  Target target_;
  std::shared_ptr<Backend> reference_;
};

class CliRunCheck : public ::testing::Test {
 protected:
  void TearDown() override { unregister_backend("cli_test_corrupting"); }
  int run_with(CorruptingBackend::Target target, std::vector<std::string> extra) {
    register_backend(std::make_shared<CorruptingBackend>(target));
    std::vector<std::string> args{"run", "--device", "cpu", "--backend", "cli_test_corrupting", "--iters", "1",
                                  "--warmup", "1", "--json", "--batch", "2", "--heads", "4", "--kv-heads", "2",
                                  "--lq", "33", "--lk", "70", "--head-dim", "16"};
    args.insert(args.end(), extra.begin(), extra.end());
    ::testing::internal::CaptureStdout();
    const int rc = run_program(args);
    json_ = ::testing::internal::GetCapturedStdout();
    doc_ = nlohmann::json::parse(json_, nullptr, /*allow_exceptions=*/false);
    return rc;
  }
  std::string json_;    // what the command printed
  nlohmann::json doc_;  // parsed (discarded when it is not JSON)
};

TEST_F(CliRunCheck, CorrectBackendPasses) {
  EXPECT_EQ(run_with(CorruptingBackend::Target::none, {"--bias", "1hqk", "--dropout", "0.2"}), 0) << json_;
  ASSERT_FALSE(doc_.is_discarded()) << json_;
  EXPECT_EQ(doc_.at("pass"), true) << json_;
  EXPECT_EQ(doc_.at("backend"), "cli_test_corrupting") << json_;
  EXPECT_EQ(doc_.at("p_effective"), 0.19921875) << json_;
  for (const char* key : {"fwd_ms", "bwd_ms", "tflops"}) EXPECT_TRUE(doc_.at(key).is_number()) << key;
  for (const char* key : {"dbias", "dq"}) EXPECT_TRUE(doc_.at("max_abs_err").contains(key)) << key;
}

TEST_F(CliRunCheck, ReportsTheCausalModeAndRatesAsTheLibraryCounts) {
  EXPECT_EQ(
      run_with(CorruptingBackend::Target::none, {"--causal", "bottom_right", "--dtype", "fp32"}), 0)
      << json_;
  ASSERT_FALSE(doc_.is_discarded()) << json_;
  EXPECT_EQ(doc_.at("causal"), causal_mode_name(CausalMode::bottom_right)) << json_;
  EXPECT_EQ(doc_.at("dtype"), dtype_name(DType::f32)) << json_;
  const double fwd_ms = doc_.at("fwd_ms").get<double>(), bwd_ms = doc_.at("bwd_ms").get<double>();
  const double flops = attention_flops(2, 4, 33, 70, 16, CausalMode::bottom_right);
  EXPECT_NEAR(doc_.at("fwd_tflops").get<double>() * fwd_ms * 1e9, flops, 1e-6 * flops) << json_;
  EXPECT_NEAR(doc_.at("bwd_tflops").get<double>() * bwd_ms * 1e9,
              pass_flop_factor(Pass::backward) * flops, 1e-6 * flops)
      << json_;
  EXPECT_NEAR(doc_.at("tflops").get<double>() * (fwd_ms + bwd_ms) * 1e9,
              training_flop_factor() * flops, 1e-6 * flops)
      << json_;
}

// A windowed, ALiBi and softcapped run is checked against the reference on the cpu backend,
// names the features in its report and counts only the visible pairs' FLOPs.
TEST_F(CliRunCheck, WindowAlibiAndSoftcapAreCheckedAndCountedByTheirVisiblePairs) {
  ::testing::internal::CaptureStdout();
  const int rc =
      run_program({"run",        "--device", "cpu",    "--backend", "cpu",  "--iters", "1",
                   "--warmup",   "1",        "--json", "--batch",   "2",    "--heads", "4",
                   "--kv-heads", "2",        "--lq",   "33",        "--lk", "70",      "--head-dim",
                   "16",         "--causal", "none",   "--window",  "9,2",  "--alibi", "--softcap",
                   "5",          "--bias",   "1hqk"});
  json_ = ::testing::internal::GetCapturedStdout();
  doc_ = nlohmann::json::parse(json_, nullptr, /*allow_exceptions=*/false);
  EXPECT_EQ(rc, 0) << json_;
  ASSERT_FALSE(doc_.is_discarded()) << json_;
  EXPECT_EQ(doc_.at("pass"), true) << json_;
  EXPECT_EQ(doc_.at("backend"), "cpu") << json_;
  EXPECT_EQ(doc_.at("window"), nlohmann::json::array({9, 2})) << json_;
  EXPECT_EQ(doc_.at("alibi"), true) << json_;
  EXPECT_EQ(doc_.at("softcap"), 5.0) << json_;
  const double flops = attention_flops(2, 4, 33, 70, 16, CausalMode::none, Window{9, 2});
  EXPECT_LT(flops, attention_flops(2, 4, 33, 70, 16, CausalMode::none) / 4);
  EXPECT_NEAR(doc_.at("fwd_tflops").get<double>() * doc_.at("fwd_ms").get<double>() * 1e9, flops,
              1e-6 * flops)
      << json_;
}

TEST_F(CliRunCheck, WrongOutputFails) {
  EXPECT_EQ(run_with(CorruptingBackend::Target::out, {}), 1) << json_;
  ASSERT_FALSE(doc_.is_discarded()) << json_;
  EXPECT_EQ(doc_.at("pass"), false) << json_;
}

TEST_F(CliRunCheck, WrongGradientFailsInTheSampledCheck) {
  // Batch 0 and query heads 0..1 (kv head 0) are checked: the corrupted dk element is in it.
  EXPECT_EQ(run_with(CorruptingBackend::Target::dk, {"--check", "1"}), 1) << json_;
  EXPECT_NE(json_.find("sampled"), std::string::npos) << json_;
}

TEST_F(CliRunCheck, WrongDbiasFailsWhenItSumsOverUnsampledHeads) {
  // 1h1k sums over batches: the sampled check reruns the backend on the sub-problem for dbias.
  EXPECT_EQ(run_with(CorruptingBackend::Target::dbias, {"--check", "2", "--bias", "1h1k"}), 1) << json_;
  EXPECT_EQ(run_with(CorruptingBackend::Target::none, {"--check", "2", "--bias", "1h1k"}), 0) << json_;
}

struct MaskCase {
  std::int64_t B = 2, H = 3, Lq = 9, Lk = 140;
  double p = 0.3;
  std::uint64_t seed = 99, offset = 5;
  IndexRange b{1, 2}, h{1, 3}, rows{5, 9}, cols{60, 131};
  std::vector<std::string> args(const std::string& format, const std::filesystem::path& out) const {
    auto range = [](const IndexRange& r) { return std::to_string(r.begin) + ":" + std::to_string(r.end); };
    return {"mask", "--batch", std::to_string(B), "--heads", std::to_string(H), "--lq", std::to_string(Lq), "--lk",
            std::to_string(Lk), "--dropout", "0.3", "--seed", std::to_string(seed), "--offset", std::to_string(offset),
            "--b", range(b), "--h", range(h), "--rows", range(rows), "--cols", range(cols), "--format", format,
            "--out", out.string()};
  }
  bool keep(std::int64_t bi, std::int64_t hi, std::int64_t i, std::int64_t j) const {
    return dropout_keep(seed, offset, p, H, bi, hi, i, j);
  }
};

TEST(CliMask, TextMatchesDropoutKeep) {
  const MaskCase mc;
  const auto path = temp_file("mask.txt");
  ASSERT_EQ(run_program(mc.args("text", path)), 0);
  std::istringstream in(read_file(path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') lines.push_back(line);
  }
  ASSERT_EQ(static_cast<std::int64_t>(lines.size()), mc.b.size() * mc.h.size() * mc.rows.size());
  std::size_t row = 0, kept = 0, total = 0;
  for (std::int64_t b = mc.b.begin; b < mc.b.end; ++b)
    for (std::int64_t h = mc.h.begin; h < mc.h.end; ++h)
      for (std::int64_t i = mc.rows.begin; i < mc.rows.end; ++i, ++row) {
        ASSERT_EQ(static_cast<std::int64_t>(lines[row].size()), mc.cols.size());
        for (std::int64_t j = mc.cols.begin; j < mc.cols.end; ++j) {
          const char expected = mc.keep(b, h, i, j) ? '1' : '0';
          ASSERT_EQ(lines[row][static_cast<std::size_t>(j - mc.cols.begin)], expected)
              << "b=" << b << " h=" << h << " i=" << i << " j=" << j;
          kept += expected == '1';
          ++total;
        }
      }
  // Not all-ones or all-zeros: p = 0.3 keeps about 70%.
  EXPECT_GT(kept, total / 2);
  EXPECT_LT(kept, total);
  std::filesystem::remove(path);
}

TEST(CliMask, BitsAndNpyMatchDropoutKeep) {
  const MaskCase mc;
  const auto bits_path = temp_file("mask.bits"), npy_path = temp_file("mask.npy");
  ASSERT_EQ(run_program(mc.args("bits", bits_path)), 0);
  ASSERT_EQ(run_program(mc.args("npy", npy_path)), 0);
  const std::string bits = read_file(bits_path), npy = read_file(npy_path);
  const std::int64_t words = (mc.cols.size() + 63) / 64;
  const std::int64_t rows = mc.b.size() * mc.h.size() * mc.rows.size();
  ASSERT_EQ(static_cast<std::int64_t>(bits.size()), rows * words * 8);
  ASSERT_GE(npy.size(), 10u);
  EXPECT_EQ(npy.substr(0, 6), "\x93NUMPY");
  const std::size_t header_len = static_cast<unsigned char>(npy[8]) | static_cast<unsigned char>(npy[9]) << 8;
  const std::string header = npy.substr(10, header_len);
  EXPECT_NE(header.find("'descr': '|u1'"), std::string::npos) << header;
  EXPECT_NE(header.find("'shape': (1, 2, 4, 71, )"), std::string::npos) << header;
  EXPECT_EQ((10 + header_len) % 64, 0u);
  const std::string data = npy.substr(10 + header_len);
  ASSERT_EQ(static_cast<std::int64_t>(data.size()), rows * mc.cols.size());
  std::int64_t row = 0;
  for (std::int64_t b = mc.b.begin; b < mc.b.end; ++b)
    for (std::int64_t h = mc.h.begin; h < mc.h.end; ++h)
      for (std::int64_t i = mc.rows.begin; i < mc.rows.end; ++i, ++row)
        for (std::int64_t c = 0; c < mc.cols.size(); ++c) {
          const bool expected = mc.keep(b, h, i, mc.cols.begin + c);
          const auto byte = static_cast<unsigned char>(bits[static_cast<std::size_t>((row * words + c / 64) * 8 + (c % 64) / 8)]);
          ASSERT_EQ(((byte >> (c % 8)) & 1) != 0, expected) << "bits: row " << row << " col " << c;
          ASSERT_EQ(data[static_cast<std::size_t>(row * mc.cols.size() + c)], expected ? 1 : 0) << "npy: row " << row;
        }
  std::filesystem::remove(bits_path);
  std::filesystem::remove(npy_path);
}

}  // namespace
}  // namespace memeff::cli
