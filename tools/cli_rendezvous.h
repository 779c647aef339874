// The file through which rank 0 of `memeff run --context-parallel` over NCCL hands its NCCL unique
// id to the other ranks (--nccl-id-file): a private file in a private directory, with a header
// that lets a rank refuse a file left by an earlier run and report one written by another live
// run. No NCCL here: the id is bytes, so the protocol is tested on the CPU (cli_rendezvous_test).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace memeff::cli {

// A file written more than this long before a rank started is stale for it (the ranks of one run
// start within moments of each other; rank 0 writes after its setup).
inline constexpr std::chrono::seconds kIdFileSlack{10};

// Who a rank is, as the id file's checks see it. token and world are the same on every rank of
// one run; started, host and pid are the rank's own.
struct RendezvousRank {
  std::string
      token;      // run_token_from_environment(); may be empty (then only times tell runs apart)
  int world = 0;  // WORLD_SIZE
  std::chrono::system_clock::time_point started;  // when this rank started the run
  std::string host;                               // this_host()
  std::int64_t pid = 0;
};

// The rank as this process: token from the environment, started now.
RendezvousRank this_rank(int world);

// The run token: `NAME=value` of each of MEMEFF_RUN_TOKEN, TORCHELASTIC_RUN_ID, MASTER_ADDR,
// MASTER_PORT, TORCHELASTIC_RESTART_COUNT that is set, joined with ';' (torchrun sets the last
// four alike for every worker of one attempt; memeff's own launcher sets MEMEFF_RUN_TOKEN).
std::string run_token_from_environment();
std::string this_host();  // gethostname

// The file's content. Layout (integers little-endian): "MEMEFFID" | u32 version (1) | u32 world |
// i64 created (ns since the Unix epoch, writer's clock) | i64 pid | u32 host bytes | u32 token
// bytes | u32 id bytes | host | token | id | u64 FNV-1a of everything before it.
struct IdRecord {
  int world = 0;
  std::int64_t created_ns = 0;
  std::int64_t pid = 0;
  std::string host, token;
  std::vector<std::uint8_t> id;
};
std::vector<std::uint8_t> encode_id_record(const IdRecord& record);
// The record, or nullopt with *why saying what is wrong (truncated, bad magic, version, checksum).
std::optional<IdRecord> decode_id_record(std::span<const std::uint8_t> bytes, std::string* why);

// Throws memeff::Error (invalid_argument) naming --nccl-id-file unless the directory that holds
// `path` exists, is owned by this user and is not writable by group or others.
void check_id_directory(const std::string& path);

// What a rank makes of the file at `path`.
enum class IdFileState {
  missing,    // no file
  stale,      // a file this run must not use and rank 0 replaces: old, dead writer, not private,
              // not a memeff id file
  collision,  // a live file of another run (other token, or other world size)
  this_run,   // a valid file of this run
};
struct IdFileInspection {
  IdFileState state = IdFileState::missing;
  std::string what;  // for messages: "written 2025-01-02 03:04:05 UTC by pid 12 on host (...)"
  std::optional<IdRecord> record;
};
IdFileInspection inspect_id_file(const std::string& path, const RendezvousRank& rank);

// Rank 0: writes `id` to `path` (mode 0600: a temporary name in the same directory, created with
// O_EXCL, fsynced, then linked or renamed to `path`), replacing a stale file. Throws memeff::Error
// naming the path when the directory is not private or a live file of another run (or another
// rank 0 of this one) is there.
struct PublishedId {
  std::vector<std::uint8_t> contents;  // the bytes written, for retract_nccl_id
  std::string replaced;                // what stale file it replaced, "" if none
};
PublishedId publish_nccl_id(const std::string& path, const std::vector<std::uint8_t>& id,
                            const RendezvousRank& rank);

// Removes `path` if it still holds `published` (rank 0, once every rank has the id).
void retract_nccl_id(const std::string& path, const PublishedId& published);

// Ranks other than 0: waits for a file of this run at `path` and returns its id. Stale files are
// waited past; a collision throws at once; at the deadline the error says what was found there.
// `progress` (if set) gets a line about every 15 s of waiting.
std::vector<std::uint8_t> await_nccl_id(
    const std::string& path, const RendezvousRank& rank, int rank_index,
    std::chrono::milliseconds timeout,
    const std::function<void(const std::string&)>& progress = {});

}  // namespace memeff::cli
