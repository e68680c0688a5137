// mmsp-run's engine: starts N local ranks with torchrun's environment variables,
// forwards their output line by line with a "[rank K] " prefix, and stops all of
// them when one fails. Plain POSIX + C++17, no LibTorch; flags are parsed in
// launcher_main.cpp and rendezvous is left to the ranks (c10d TCPStore).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mmsp::cli {

// What `mmsp-run` was asked to do; each field is named after its flag.
struct LaunchOptions {
  int nproc = 1;                          // -n: ranks started on this node
  int nnodes = 1;                         // --nnodes: nodes in the job
  int node_rank = 0;                      // --node-rank: this node's index in [0, nnodes)
  std::string master_addr = "127.0.0.1";  // --master-addr: where rank 0's TCPStore listens
  int master_port = 0;                    // --master-port; 0: a free port (single node only)
  bool prefix = true;                     // --no-prefix: ranks write straight to our stdout/stderr
  double grace_s = 2.0;                   // --grace: time the others get after the first failure
  double kill_after_s = 3.0;              // --kill-after: delay from SIGTERM to SIGKILL
  std::vector<std::string> command;       // PROGRAM ARGS...
  std::string run_id;                     // MMSP_RUN_ID of every rank; empty: the parent's, if any
};

// Checks everything a user can fix before anything starts; throws mmsp::Error that
// names the bad value. Returns the path PROGRAM resolves to.
std::string validate(const LaunchOptions& options);

// Resolves `name` like execvp: as given when it contains '/', else in each entry of
// `path_list` (":"-separated, an empty entry is "."). Throws if none is executable.
std::string find_executable(const std::string& name, const std::string& path_list);

// A TCP port that was free on `addr` a moment ago (bind port 0, read it, release).
int find_free_port(const std::string& addr);

// A run id for one launch: host, pid and start time ("mmsp-run:node0:4242:1763859600123").
std::string make_run_id();

// The environment of one rank: `parent` ("NAME=value" entries) minus the variables
// we set, plus RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
// and, when options.run_id is set, MMSP_RUN_ID.
std::vector<std::string> rank_environment(const LaunchOptions& options, int local_rank,
                                          const std::vector<std::string>& parent);

// "exited with status 3" or "killed by signal 9 (Killed)", for a waitpid() status.
std::string describe_wait_status(int status);

// Cuts a byte stream into whole lines, each prefixed; keeps the unfinished tail.
class LinePrefixer {
 public:
  explicit LinePrefixer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string feed(std::string_view bytes);  // the lines completed by `bytes`, prefixed
  std::string finish();                      // the unterminated tail as a line ("" if none)

 private:
  std::string prefix_;
  std::string partial_;
};

// Starts the ranks of a validated `options` (master_port already chosen) and
// supervises them until all have exited. Returns mmsp-run's exit status.
int launch(const LaunchOptions& options, const std::string& program_path);

}  // namespace mmsp::cli
