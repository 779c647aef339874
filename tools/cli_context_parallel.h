// `memeff run --context-parallel N`: the problem of `memeff run`, sharded over N ranks and run as
// ring attention (include/memeff/context_parallel.h), checked against the single-device run of
// the same inputs.
#pragma once

#include <string>
#include <vector>

#include "cli_args.h"

namespace memeff::cli {

// On the CPU (or with --cp-transport local on one GPU) every rank runs in this process over
// memeff::cp::LocalRing; with the NCCL transport each rank is a process of its own, started by
// this program (one per GPU) or by torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK) with
// the NCCL unique id exchanged through a file.
struct ContextParallelRun {
  ShapeConfig shape;
  DeviceChoice device = DeviceChoice::automatic;
  std::string backend;  // --backend: the allow-list of the block calls and the single-device run
  bool json = false;
  int ranks = 1;                   // --context-parallel
  std::string layout = "auto";     // --cp-layout: auto or a cp::layout_name
  std::string transport = "auto";  // --cp-transport: auto, local, nccl
  std::string id_file;             // --nccl-id-file (else $MEMEFF_NCCL_ID_FILE)
  std::vector<std::string> argv;   // the run command's arguments, for the launched ranks
};

int run_context_parallel(const ContextParallelRun& run);

}  // namespace memeff::cli
