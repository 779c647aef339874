// `memeff mask`: writes the dropout mask of a shape, or a window of it, as the kernels draw it
// (memeff::dropout_mask, the one map every backend uses). The mask is produced in chunks of
// rows, so any size streams in bounded memory. Formats: 0/1 text rows, packed bits, or .npy.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_args.h"
#include "cli_commands.h"
#include "memeff/dropout.h"
#include "memeff/error.h"

namespace memeff::cli {

namespace {

struct MaskConfig {
  std::int64_t B = 2, H = 8, Lq = 512;
  std::optional<std::int64_t> Lk;
  double dropout = 0.1;
  std::uint64_t seed = 0, offset = 0;
  std::optional<IndexRange> b, h, rows, cols;
  std::string format = "text";
  std::string out = "-";
  bool no_header = false;
  // Packed sequences: sequence s is batch s, with its own lengths (empty: a dense batch).
  std::vector<std::int64_t> seqlens, kv_seqlens;
};

// Elements per chunk: 16 Mi keeps the buffer at 16 MiB whatever the window.
constexpr std::int64_t kChunkElements = std::int64_t{1} << 24;

class Output {
 public:
  explicit Output(const std::string& path) : path_(path) {
    if (path == "-") {
      file_ = stdout;
    } else {
      file_ = std::fopen(path.c_str(), "wb");
      if (file_ == nullptr) {
        throw Error(ErrorCode::io_error, "--out: cannot open `" + path + "` for writing: " + std::strerror(errno));
      }
    }
  }
  ~Output() {
    if (file_ != nullptr && file_ != stdout) std::fclose(file_);
  }
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;
  void write(const void* data, std::size_t bytes) {
    if (bytes != 0 && std::fwrite(data, 1, bytes, file_) != bytes) fail();
  }
  void write(const std::string& s) { write(s.data(), s.size()); }
  void close() {
    if (std::fflush(file_) != 0) fail();
    if (file_ != stdout) {
      const int rc = std::fclose(file_);
      file_ = nullptr;
      if (rc != 0) fail();
    }
  }

 private:
  [[noreturn]] void fail() {
    throw Error(ErrorCode::io_error, "--out: writing `" + path_ + "` failed: " + std::strerror(errno));
  }
  std::string path_;
  std::FILE* file_ = nullptr;
};

IndexRange resolve(const std::optional<IndexRange>& r, std::int64_t size, const char* flag, const char* dim) {
  if (!r) return {0, size};
  if (r->end > size) {
    throw UsageError(std::string(flag) + ": range " + std::to_string(r->begin) + ":" + std::to_string(r->end) +
                     " exceeds " + dim + " = " + std::to_string(size));
  }
  return *r;
}

// The .npy v1.0 header of a C-order uint8 array.
std::string npy_header(const std::vector<std::int64_t>& dims) {
  std::string shape = "(";
  for (std::int64_t d : dims) shape += std::to_string(d) + ", ";
  shape += ")";
  std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': " + shape + ", }";
  const std::size_t unpadded = 10 + dict.size() + 1;  // magic(6) version(2) len(2) dict '\n'
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  std::string h = "\x93NUMPY";
  h += '\x01';
  h += '\x00';
  h += static_cast<char>(dict.size() & 0xFF);
  h += static_cast<char>((dict.size() >> 8) & 0xFF);
  return h + dict;
}

int write_mask(MaskConfig mc) {
  const bool packed = !mc.seqlens.empty();
  if (packed) {
    mc.kv_seqlens = packed_key_lengths(mc.seqlens, mc.kv_seqlens);
    mc.B = static_cast<std::int64_t>(mc.seqlens.size());
    mc.Lq = 0;
    std::int64_t max_k = 0;
    for (std::size_t s = 0; s < mc.seqlens.size(); ++s) {
      mc.Lq = std::max(mc.Lq, mc.seqlens[s]);
      max_k = std::max(max_k, mc.kv_seqlens[s]);
    }
    mc.Lk = max_k;
  }
  const std::int64_t Lk = mc.Lk.value_or(mc.Lq);
  const IndexRange b = resolve(mc.b, mc.B, "--b", "--batch"), h = resolve(mc.h, mc.H, "--h", "--heads"),
                   rows = resolve(mc.rows, mc.Lq, "--rows", "--lq"), cols = resolve(mc.cols, Lk, "--cols", "--lk");
  const DropoutThreshold dt = dropout_threshold(mc.dropout);

  // A sequence's window: the requested one cut to its own lengths (the whole window when dense).
  auto rows_of = [&](std::int64_t bi) {
    if (!packed) return rows;
    return IndexRange{std::min(rows.begin, mc.seqlens[bi]), std::min(rows.end, mc.seqlens[bi])};
  };
  auto cols_of = [&](std::int64_t bi) {
    if (!packed) return cols;
    return IndexRange{std::min(cols.begin, mc.kv_seqlens[bi]), std::min(cols.end, mc.kv_seqlens[bi])};
  };
  if (packed && mc.format == "npy" && b.size() != 1) {
    throw UsageError("--format npy: packed sequences have their own shapes; pick one with --b S");
  }

  Output out(mc.out);
  if (mc.format == "npy") {
    out.write(npy_header({b.size(), h.size(), rows_of(b.begin).size(), cols_of(b.begin).size()}));
  }
  if (mc.format == "text" && !mc.no_header) {
    char probabilities[80];
    std::snprintf(probabilities, sizeof probabilities, "p=%g p_effective=%.9g", mc.dropout, dt.p_effective);
    out.write("# memeff dropout mask: " + std::string(probabilities) +
              " seed=" + std::to_string(mc.seed) + " offset=" + std::to_string(mc.offset) + " heads=" +
              std::to_string(mc.H) + " (1 = kept)\n");
  }
  std::vector<std::uint8_t> keep;
  std::vector<std::uint64_t> bits;
  std::string text;
  std::int64_t packed_row0 = 0, packed_col0 = 0;  // first packed query row and key of sequence b
  for (std::int64_t s = 0; packed && s < b.begin; ++s) {
    packed_row0 += mc.seqlens[s];
    packed_col0 += mc.kv_seqlens[s];
  }
  for (std::int64_t bi = b.begin; bi < b.end; ++bi) {
    const IndexRange rows = rows_of(bi), cols = cols_of(bi);
    const std::int64_t words = (cols.size() + 63) / 64;
    const std::int64_t chunk_rows =
        std::max<std::int64_t>(1, kChunkElements / std::max<std::int64_t>(cols.size(), 1));
    for (std::int64_t hi = h.begin; hi < h.end; ++hi) {
      if (mc.format == "text" && !mc.no_header) {
        std::string where;
        if (packed) {
          where = " (packed sequence " + std::to_string(bi) + ": query rows " +
                  std::to_string(packed_row0) + ":" + std::to_string(packed_row0 + mc.seqlens[bi]) +
                  ", keys " + std::to_string(packed_col0) + ":" +
                  std::to_string(packed_col0 + mc.kv_seqlens[bi]) + " of the packed tensors)";
        }
        out.write("# b=" + std::to_string(bi) + " h=" + std::to_string(hi) + " rows " + std::to_string(rows.begin) +
                  ":" + std::to_string(rows.end) + " cols " + std::to_string(cols.begin) + ":" +
                  std::to_string(cols.end) + where + "\n");
      }
      for (std::int64_t r0 = rows.begin; r0 < rows.end; r0 += chunk_rows) {
        MaskWindow w;
        w.heads = mc.H;
        w.batch_begin = bi;
        w.batch_count = 1;
        w.head_begin = hi;
        w.head_count = 1;
        w.row_begin = r0;
        w.rows = std::min(chunk_rows, rows.end - r0);
        w.col_begin = cols.begin;
        w.cols = cols.size();
        if (mc.format == "bits") {
          bits.assign(static_cast<std::size_t>(w.rows * words), 0);
          dropout_keep_bits(mc.seed, mc.offset, mc.dropout, w, bits.data());
          // The file format is little-endian; convert on a big-endian host.
          if constexpr (std::endian::native == std::endian::big) {
            for (std::uint64_t& word : bits) word = __builtin_bswap64(word);
          }
          out.write(bits.data(), bits.size() * sizeof(std::uint64_t));
          continue;
        }
        keep.assign(static_cast<std::size_t>(w.rows * w.cols), 0);
        dropout_mask(mc.seed, mc.offset, mc.dropout, w, keep.data());
        if (mc.format == "npy") {
          out.write(keep.data(), keep.size());
          continue;
        }
        text.clear();
        text.reserve(static_cast<std::size_t>(w.rows * (w.cols + 1)));
        for (std::int64_t r = 0; r < w.rows; ++r) {
          for (std::int64_t c = 0; c < w.cols; ++c) text += keep[static_cast<std::size_t>(r * w.cols + c)] ? '1' : '0';
          text += '\n';
        }
        out.write(text);
      }
    }
    if (packed) {
      packed_row0 += mc.seqlens[bi];
      packed_col0 += mc.kv_seqlens[bi];
    }
  }
  out.close();
  return 0;
}

}  // namespace

Command add_mask_command(CLI::App& program) {
  auto mc = std::make_shared<MaskConfig>();
  CLI::App* app = program.add_subcommand(
      "mask", R"(write the dropout mask of a shape (or a window of it) as text, bits or .npy

Writes the dropout keep mask (1 = kept, 0 = dropped) of attention with these sizes and RNG
state: exactly the mask every memeff backend applies, in forward and backward. Elements are
(batch b, query head h, query row i, key column j); the mask of head h of batch b is keyed
by b*heads + h (docs/dropout.md). Streams in chunks, so any size works.
)");
  add_checked(*app, "--batch", mc->B, "N", integer(0), "batch size B (default 2)");
  add_checked(*app, "--heads", mc->H, "N", integer(1), "query heads Hq of the call (default 8)");
  add_checked(*app, "--lq", mc->Lq, "N", integer(0), "query length (default 512)");
  add_checked(*app, "--lk", mc->Lk, "N", integer(0), "key length (default Lq)");
  add_checked(*app, "--dropout", mc->dropout, "P", probability(),
              "dropout probability in [0, 1) (default 0.1)");
  add_checked(*app, "--seed", mc->seed, "S", unsigned64(), "seed (default 0)");
  add_checked(*app, "--offset", mc->offset, "O", unsigned64(), "offset (default 0)");
  const std::string range = "N or A:B (half-open, 0 <= A <= B)";
  add_value(*app, "--b", mc->b, IndexRange::from_text, range, "A:B",
            "batches of the window (N or A:B, half-open; default all)");
  add_value(*app, "--h", mc->h, IndexRange::from_text, range, "A:B",
            "heads of the window (default all)");
  add_value(*app, "--rows", mc->rows, IndexRange::from_text, range, "A:B",
            "query rows of the window (default all)");
  add_value(*app, "--cols", mc->cols, IndexRange::from_text, range, "A:B",
            "key columns of the window (default all)");
  add_name(*app, "--format", mc->format, {"text", "bits", "npy"},
           "text (default): one line of 0/1 per row, a '#' line before each head;\n"
           "bits: raw little-endian uint64 words, ceil(cols/64) per row, bit c%64 of word c/64 = "
           "column c;\n"
           "npy: a NumPy uint8 array [batches, heads, rows, cols]");
  app->add_option("--out", mc->out, "output file (default - : stdout)")->type_name("FILE");
  app->add_flag("--no-header", mc->no_header, "text format: no '#' lines");
  add_packed_flags(
      *app, mc->seqlens, mc->kv_seqlens,
      "packed sequences of these query lengths: sequence s draws batch s's mask over its own\n"
      "rows and columns (B is the number of sequences; npy needs one sequence, --b S)");
  app->footer(R"(example: memeff mask --lq 4 --lk 64 --batch 1 --heads 1 --dropout 0.5 --seed 7
         memeff mask --batch 8 --heads 16 --lq 2048 --b 3 --h 5 --rows 100:102 --format npy --out m.npy)");
  return {app, [mc](const std::vector<std::string>&) { return write_mask(*mc); }};
}

}  // namespace memeff::cli
