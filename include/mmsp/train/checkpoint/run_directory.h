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

#include "mmsp/dist/mesh.h"

namespace mmsp::train {

// What a previous run left in a directory: "metrics.jsonl (40 lines)", "step-000040", "latest".
std::vector<std::string> previous_run_files(const std::string& out);

// A requeued job (Slurm's --requeue, a retry loop) always passes --resume OUT: true when
// `resume` is `out` itself and `out` holds no checkpoint yet (nothing, or only the lock
// and metrics of the same job stopped before its first save): the run starts at step 1.
// A --resume that names anything else and holds no checkpoint stays an error.
bool resumes_from_nothing(const std::string& out, const std::string& resume);

// In a job whose ranks span hosts, --out must be one directory that every host sees:
// rank 0 writes the checkpoints there, with --shard every rank writes its optimizer part
// there, and on --resume every rank reads them. Every rank reads the note rank 0 wrote
// in its lock file (RunDirectoryLock::claim, before the rendezvous) and the ranks compare
// through the store; a host that sees another note, or none, is refused on every rank,
// naming it and the missing shared storage, before the first collective. No-op on one
// host or without --out.
void check_out_shared(const std::string& out, const dist::Mesh& mesh);

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
