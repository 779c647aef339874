// The top-level of the memeff program: picks the subcommand, and maps every outcome to the exit
// status (0 ok; 1 a runtime error or a failed check; 2 a bad command line), so scripts and CTest
// can rely on it.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli_args.h"
#include "cli_commands.h"
#include "memeff/attention.h"
#include "memeff/error.h"

namespace memeff::cli {

namespace {

struct Command {
  const char* name;
  int (*run)(const std::vector<std::string>&);
  const char* summary;
};

const Command kCommands[] = {
    {"run", run_command, "forward + backward on random inputs: timings, TFLOP/s, errors vs the reference"},
    {"mask", mask_command, "write the dropout mask of a shape (or a window of it) as text, bits or .npy"},
    {"explain", explain_command, "show which backend the dispatcher picks for a shape, and why"},
    {"tune", tune_command, "autotune a list of shapes ahead of time (--shapes FILE), or --show the cache"},
    {"bench", bench_command, "benchmark forward/backward on a list of shapes (GPU: CUDA events, L2 flushed)"},
};

std::string program_help() {
  std::string s = std::string("memeff ") + version() +
                  ": fused scaled-dot-product attention with dropout (CPU and CUDA)\n\n"
                  "usage: memeff <command> [flags]     memeff <command> --help\n\ncommands:\n";
  for (const Command& c : kCommands) {
    std::string name = std::string("  ") + c.name;
    name.resize(12, ' ');
    s += name + c.summary + "\n";
  }
  s += "\nexit status: 0 success, 1 runtime error or failed check, 2 bad command line\n"
       "environment: MEMEFF_BACKENDS (backend order), MEMEFF_AUTOTUNE=1, MEMEFF_CACHE_DIR,\n"
       "             MEMEFF_LOG_DISPATCH=1, OMP_NUM_THREADS (CPU backends)\n";
  return s;
}

}  // namespace

int main_program(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.empty()) {
      std::fputs(program_help().c_str(), stderr);
      throw UsageError("missing command (run, mask, explain, tune, bench)");
    }
    const std::string name = args[0];
    if (name == "--help" || name == "-h" || name == "help") {
      std::fputs(program_help().c_str(), stdout);
      return 0;
    }
    if (name == "--version" || name == "version") {
      std::printf("memeff %s\n", version());
      return 0;
    }
    for (const Command& c : kCommands) {
      if (name == c.name) return c.run(std::vector<std::string>(args.begin() + 1, args.end()));
    }
    throw UsageError("unknown command `" + name + "` (commands: run, mask, explain, tune, bench; see memeff --help)");
  } catch (const HelpShown&) {
    return 0;
  } catch (const UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "memeff: error: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "memeff: %s: %s\n", error_code_name(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "memeff: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace memeff::cli
