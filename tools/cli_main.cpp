// The top level of the memeff program: one CLI11 app with a subcommand per command. It parses the
// command line, runs the chosen command and maps every outcome to the exit status (0 ok; 1 a
// runtime error or a failed check; 2 a bad command line), so scripts and CTest can rely on it.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "cli_args.h"
#include "cli_commands.h"
#include "memeff/attention.h"
#include "memeff/error.h"

namespace memeff::cli {

namespace {

// Lists each command by the first line of its description; the rest is for its own --help.
class ProgramFormatter : public CLI::Formatter {
 public:
  std::string make_subcommand(const CLI::App* sub) const override {
    const std::string& description = sub->get_description();
    std::string line = "  " + sub->get_name();
    line.resize(std::max(get_column_width(), line.size() + 1), ' ');
    return line + description.substr(0, description.find('\n')) + "\n";
  }
};

// CLI11 keeps a command's unknown arguments (allow_extras) so that the first can be named here.
void refuse_extras(const CLI::App& command) {
  const std::vector<std::string> extras = command.remaining();
  if (extras.empty()) return;
  const std::string& arg = extras.front();
  const std::string name = "memeff " + command.get_name();
  const bool flag = arg.size() > 1 && arg[0] == '-';
  throw UsageError("`" + name + "`: " + (flag ? "unknown flag `" : "unexpected argument `") +
                   arg.substr(0, flag ? arg.find('=') : arg.npos) + "` (see `" + name +
                   " --help`)");
}

}  // namespace

int main_program(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  CLI::App program(std::string("memeff ") + version() +
                       ": fused scaled-dot-product attention with dropout (CPU and CUDA)",
                   "memeff");
  program.formatter(std::make_shared<ProgramFormatter>());  // before the subcommands, which copy it
  program.set_version_flag("--version", std::string("memeff ") + version());
  program.require_subcommand(1);
  program.footer(
      "exit status: 0 success, 1 runtime error or failed check, 2 bad command line\n"
      "environment: MEMEFF_BACKENDS (backend order), MEMEFF_AUTOTUNE=1, MEMEFF_CACHE_DIR,\n"
      "             MEMEFF_LOG_DISPATCH=1, OMP_NUM_THREADS (CPU backends)");
  const Command commands[] = {add_run_command(program), add_mask_command(program),
                              add_explain_command(program), add_tune_command(program),
                              add_bench_command(program)};
  std::string names;
  for (const Command& c : commands) {
    c.app->allow_extras();  // kept for refuse_extras, which names the first
    names += (names.empty() ? "" : ", ") + c.app->get_name();
  }
  try {
    if (args.empty()) {
      std::fputs(program.help().c_str(), stderr);
      throw UsageError("missing command (" + names + ")");
    }
    const bool known = std::any_of(std::begin(commands), std::end(commands),
                                   [&](const Command& c) { return c.app->get_name() == args[0]; });
    if (!known && args[0][0] != '-') {
      throw UsageError("unknown command `" + args[0] + "` (commands: " + names +
                       "; see memeff --help)");
    }
    program.parse(argc, argv);
    for (const Command& c : commands) {
      if (!c.app->parsed()) continue;
      refuse_extras(*c.app);
      return c.run(std::vector<std::string>(args.begin() + 1, args.end()));
    }
    throw UsageError("missing command (" + names + ")");
  } catch (const CLI::CallForHelp&) {
    std::fputs(program.help().c_str(), stdout);  // the chosen command's help, if there is one
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::printf("%s\n", e.what());
    return 0;
  } catch (const CLI::ParseError& e) {  // UsageError too
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
