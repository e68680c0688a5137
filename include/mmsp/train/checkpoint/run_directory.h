// --out belongs to one job at a time, and a fresh run does not silently mix into
// another run's directory.
//
// The lock is an flock(2) on "<out>/.mmsp-lock", held by rank 0 (the rank that writes
// metrics and checkpoints) for the whole run: the kernel drops it when the owner dies,
// however it dies, and a reboot forgets it, so a stale lock never blocks a restart.
// (flock over NFS depends on the server; docs/reliability.md says so.)
#pragma once

#include <string>
#include <vector>

namespace mmsp::train {

// What a previous run left in a directory: "metrics.jsonl (40 lines)", "step-000040", "latest".
std::vector<std::string> previous_run_files(const std::string& out);

class RunDirectoryLock {
 public:
  RunDirectoryLock() = default;  // holds nothing
  // Locks `out` (created if needed) or throws naming the owner (pid, host, start time).
  // Then, when `out` already holds a run: with `resume` (a checkpoint in `out`, or
  // `out` itself) the run continues; with `overwrite` its metrics and checkpoints are
  // deleted; otherwise throws, listing what is there and the three ways on.
  static RunDirectoryLock claim(const std::string& out, const std::string& resume, bool overwrite);
  ~RunDirectoryLock();
  RunDirectoryLock(RunDirectoryLock&& other) noexcept;
  RunDirectoryLock& operator=(RunDirectoryLock&& other) noexcept;
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace mmsp::train
