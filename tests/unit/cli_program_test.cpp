// Tests of the memeff program (tools/cli_*.cpp, linked as memeff_cli_lib): the value parsers
// name the flag they reject; bad command lines exit with 2; `memeff run` fails (exit 1) when a
// backend's output is wrong, including through the sampled check; `memeff mask` writes exactly
// memeff::dropout_keep in each of its formats.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli_args.h"
#include "cli_commands.h"
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

TEST(CliParse, BiasPatterns) {
  const BiasPattern none = parse_bias("--bias", "none");
  EXPECT_FALSE(none.present);
  const BiasPattern full = parse_bias("--bias", "full");
  EXPECT_TRUE(full.present);
  EXPECT_FALSE(full.bcast_b || full.bcast_h || full.bcast_q);
  EXPECT_EQ(full.text(), "bhqk");
  const BiasPattern p = parse_bias("--bias", "1hqk");
  EXPECT_TRUE(p.bcast_b);
  EXPECT_FALSE(p.bcast_h);
  EXPECT_FALSE(p.bcast_q);
  const BiasPattern r = parse_bias("--bias", "b11k");
  EXPECT_FALSE(r.bcast_b);
  EXPECT_TRUE(r.bcast_h && r.bcast_q);
  EXPECT_EQ(r.text(), "b11k");
  for (const char* bad : {"bhq1", "xhqk", "bhqkk", "", "1111", "hbqk"}) {
    EXPECT_NE(usage_error([&] { parse_bias("--bias", bad); }).find("--bias"), std::string::npos) << bad;
  }
}

TEST(CliParse, ValuesNameTheFlag) {
  EXPECT_EQ(parse_int("--lq", "129"), 129);
  EXPECT_NE(usage_error([] { parse_int("--lq", "12x"); }).find("--lq"), std::string::npos);
  EXPECT_NE(usage_error([] { parse_int("--heads", "0", 1); }).find(">= 1"), std::string::npos);
  EXPECT_EQ(parse_u64("--seed", "18446744073709551615"), 18446744073709551615ull);
  EXPECT_NE(usage_error([] { parse_u64("--seed", "-1"); }).find("--seed"), std::string::npos);
  EXPECT_DOUBLE_EQ(parse_probability("--dropout", "0.25"), 0.25);
  EXPECT_NE(usage_error([] { parse_probability("--dropout", "1"); }).find("[0, 1)"), std::string::npos);
  EXPECT_NE(usage_error([] { parse_double("--scale", "nan"); }).find("--scale"), std::string::npos);
  EXPECT_EQ(parse_dtype("--dtype", "bf16"), DType::bf16);
  EXPECT_NE(usage_error([] { parse_dtype("--dtype", "fp64"); }).find("--dtype"), std::string::npos);
  EXPECT_EQ(parse_causal("--causal", "bottom-right"), CausalMode::bottom_right);
  EXPECT_EQ(parse_causal("--causal", "0"), CausalMode::none);
  EXPECT_NE(usage_error([] { parse_causal("--causal", "left"); }).find("--causal"), std::string::npos);
  const IndexRange r = parse_range("--rows", "3:10");
  EXPECT_EQ(r.begin, 3);
  EXPECT_EQ(r.end, 10);
  EXPECT_EQ(parse_range("--b", "4").size(), 1);
  EXPECT_NE(usage_error([] { parse_range("--cols", "9:3"); }).find("--cols"), std::string::npos);
}

TEST(CliParse, FlagParser) {
  std::int64_t n = 0;
  std::vector<std::string> many;
  bool on = false;
  FlagParser p("memeff test", "test");
  p.add({"--n", "N", "n", [&](const std::string& v) { n = parse_int("--n", v); }});
  p.add({"--many", "X...", "many", [&](const std::string& v) { many.push_back(v); }, true});
  p.add({"--on", "", "switch", [&](const std::string&) { on = true; }});
  p.parse({"--n=5", "--many", "a", "b", "-3", "--on"});
  EXPECT_EQ(n, 5);
  EXPECT_EQ(many, (std::vector<std::string>{"a", "b", "-3"}));
  EXPECT_TRUE(on);
  EXPECT_NE(usage_error([&] { p.parse({"--bogus"}); }).find("unknown flag `--bogus`"), std::string::npos);
  EXPECT_NE(usage_error([&] { p.parse({"--n"}); }).find("--n: expected a value"), std::string::npos);
  EXPECT_NE(usage_error([&] { p.parse({"stray"}); }).find("unexpected argument"), std::string::npos);
  EXPECT_NE(usage_error([&] { p.parse({"--on=1"}); }).find("takes no value"), std::string::npos);
}

TEST(CliParse, ShapeLines) {
  const ShapeConfig c = parse_shape_line("2,8,2,128,256,64,32,bottom-right,0.2,bf16", "f:1");
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
  const ShapeConfig flags = parse_shape_line("  --batch 3 --heads 6 --kv-heads 3 --lq 17 --bias 1hqk ", "f:3");
  EXPECT_EQ(flags.B, 3);
  EXPECT_EQ(flags.hkv(), 3);
  EXPECT_EQ(flags.lk(), 17);
  EXPECT_TRUE(flags.bias.present && flags.bias.bcast_b);
  EXPECT_NE(usage_error([] { parse_shape_line("1,4,3,64,64,32", "shapes.txt:7"); }).find("shapes.txt:7"),
            std::string::npos);  // 4 query heads over 3 kv heads
  EXPECT_NE(usage_error([] { parse_shape_line("1,4,4", "shapes.txt:8"); }).find("shapes.txt:8"), std::string::npos);
  EXPECT_NE(usage_error([] { parse_shape_line("--bogus 3", "s:9"); }).find("--bogus"), std::string::npos);
}

TEST(CliProgram, BadCommandLinesExitWith2) {
  EXPECT_EQ(run_program({}), 2);
  EXPECT_EQ(run_program({"frobnicate"}), 2);
  EXPECT_EQ(run_program({"run", "--bogus"}), 2);
  EXPECT_EQ(run_program({"run", "--batch", "two"}), 2);
  EXPECT_EQ(run_program({"run", "--causal", "sideways"}), 2);
  EXPECT_EQ(run_program({"run", "--heads", "6", "--kv-heads", "4"}), 2);
  EXPECT_EQ(run_program({"mask", "--lq", "8", "--rows", "2:9"}), 2);
  EXPECT_EQ(run_program({"bench", "--shapes", "1,2,3"}), 2);
  EXPECT_EQ(run_program({"tune"}), 2);
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
