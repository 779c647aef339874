// Writes the random bytes behind the dropout mask to stdout, raw and endless, for a statistical
// test battery (bench/dropout_battery.sh feeds them to dieharder): the 16 bytes of each Philox
// call of a mask in the order the calls cover it. With the contract's round count the calls are
// dropout_map.h's own; other counts (1-10) show what the battery detects when mixing is too weak.
//
//   memeff_keep_stream [--rounds R] [--order row|col|head] [--seed S] [--offset O] [--keys L]
//
// row: one query row's calls (L/64 blocks x 4 column classes), then the next row (8192 rows a
//      head), then the next head; col: query rows fastest; head: heads (64) fastest.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "core/dropout_map.h"
#include "core/philox.h"

namespace {

using memeff::detail::DropoutKey;
using memeff::detail::Philox4;

struct StreamArgs {
  int rounds = memeff::detail::kDropoutCallRounds;
  std::string order = "row";
  std::uint64_t seed = 0x1234, offset = 7;
  std::uint64_t keys = 4096;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "memeff_keep_stream: %s\n"
               "usage: memeff_keep_stream [--rounds 1-10] [--order row|col|head] [--seed S]\n"
               "                          [--offset O] [--keys L (a multiple of 64)]\n",
               why);
  std::exit(2);
}

StreamArgs parse(int argc, char** argv) {
  StreamArgs a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(("missing the value of " + flag).c_str());
    const char* value = argv[++i];
    if (flag == "--rounds")
      a.rounds = std::atoi(value);
    else if (flag == "--order")
      a.order = value;
    else if (flag == "--seed")
      a.seed = std::strtoull(value, nullptr, 0);
    else if (flag == "--offset")
      a.offset = std::strtoull(value, nullptr, 0);
    else if (flag == "--keys")
      a.keys = std::strtoull(value, nullptr, 0);
    else
      usage(("unknown option " + flag).c_str());
  }
  if (a.rounds < 1 || a.rounds > 10) usage("--rounds must be 1 to 10");
  if (a.order != "row" && a.order != "col" && a.order != "head") usage("--order: row, col or head");
  if (a.keys < 64 || a.keys % 64 != 0) usage("--keys must be a positive multiple of 64");
  return a;
}

// The call of (bh, i, col_block64, col_class) with kRounds rounds, counter as dropout_call's.
template <int kRounds>
Philox4 call_with_rounds(DropoutKey key, std::uint64_t bh, std::uint64_t i, std::uint64_t block,
                         std::uint32_t cls) {
  if constexpr (kRounds == memeff::detail::kDropoutCallRounds) {
    return memeff::detail::dropout_call(key, bh, i, block, cls);
  } else {
    return memeff::detail::philox4x32<kRounds>(
        static_cast<std::uint32_t>(block * 4u + cls), static_cast<std::uint32_t>(i),
        static_cast<std::uint32_t>(bh), static_cast<std::uint32_t>(bh >> 32), key.k0, key.k1);
  }
}

template <int kRounds>
void write_stream(const StreamArgs& a) {
  constexpr std::uint64_t kRows = 8192, kHeads = 64;
  const std::uint64_t calls_per_row = a.keys / 64 * 4;
  const DropoutKey key = memeff::detail::dropout_key(a.seed, a.offset);
  static Philox4 buffer[4096];
  std::size_t filled = 0;
  for (std::uint64_t t = 0;; ++t) {
    std::uint64_t call = 0, i = 0, bh = 0;
    if (a.order == "row") {
      call = t % calls_per_row, i = (t / calls_per_row) % kRows, bh = t / (calls_per_row * kRows);
    } else if (a.order == "col") {
      i = t % kRows, call = (t / kRows) % calls_per_row, bh = t / (calls_per_row * kRows);
    } else {
      bh = t % kHeads, i = (t / kHeads) % kRows, call = t / (kHeads * kRows);
    }
    buffer[filled++] = call_with_rounds<kRounds>(key, bh, i, call / 4, call % 4);
    if (filled == std::size(buffer)) {
      if (std::fwrite(buffer, sizeof(Philox4), filled, stdout) != filled) return;  // reader gone
      filled = 0;
    }
  }
}

template <int... kR>
void dispatch(const StreamArgs& a, std::integer_sequence<int, kR...>) {
  ((a.rounds == kR + 1 ? write_stream<kR + 1>(a) : void()), ...);
}

}  // namespace

int main(int argc, char** argv) {
  const StreamArgs a = parse(argc, argv);
  dispatch(a, std::make_integer_sequence<int, 10>{});
  return 0;
}
