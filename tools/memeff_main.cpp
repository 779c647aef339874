// Entry point of the memeff program; everything else lives in the memeff_cli_lib library
// (tools/cli_*.cpp) so the tests can link the same code.
#include "cli_commands.h"

int main(int argc, char** argv) { return memeff::cli::main_program(argc, argv); }
