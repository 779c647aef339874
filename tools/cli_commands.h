// The commands of the memeff program. Each registers itself as a CLI11 subcommand of the program
// (its flags bound to a config it owns) and returns the function that runs it once the command
// line is parsed; main_program picks the command and maps every outcome to the exit status.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace memeff::cli {

// Runs a parsed command: gets the arguments after the command's name (the launched ranks of
// `memeff run --context-parallel` repeat them) and returns the exit status. A command line that
// does not hold together throws UsageError (status 2), a failed call memeff::Error (status 1).
struct Command {
  CLI::App* app = nullptr;  // the subcommand, owned by the program's app
  std::function<int(const std::vector<std::string>& args)> run;
};

Command add_run_command(CLI::App& program);      // cli_run.cpp
Command add_mask_command(CLI::App& program);     // cli_mask.cpp
Command add_bench_command(CLI::App& program);    // cli_bench.cpp
Command add_explain_command(CLI::App& program);  // cli_explain_tune.cpp
Command add_tune_command(CLI::App& program);     // cli_explain_tune.cpp

// The program: parses the command line and runs the command; catches every error and maps it
// to the exit status (0 ok, 1 runtime error or failed check, 2 bad command line).
int main_program(int argc, char** argv);

}  // namespace memeff::cli
