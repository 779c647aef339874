// The subcommands of the memeff program. Each takes the arguments after its name and returns
// the exit status; a bad command line throws UsageError (status 2), a failed call memeff::Error
// (status 1). memeff_main.cpp maps the names to these functions.
#pragma once

#include <string>
#include <vector>

namespace memeff::cli {

int run_command(const std::vector<std::string>& args);      // cli_run.cpp
int mask_command(const std::vector<std::string>& args);     // cli_mask.cpp
int bench_command(const std::vector<std::string>& args);    // cli_bench.cpp
int explain_command(const std::vector<std::string>& args);  // cli_explain_tune.cpp
int tune_command(const std::vector<std::string>& args);     // cli_explain_tune.cpp

// The top-level program: parses the command name and runs it; catches every error and maps it
// to the exit status (0 ok, 1 runtime error or failed check, 2 bad command line).
int main_program(int argc, char** argv);

}  // namespace memeff::cli
