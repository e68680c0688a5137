// A bound on a rank's start-up whatever its peers do. c10d's TCPStore client blocks
// without a deadline on a listener that never answers (another program on
// MASTER_PORT), a stopped store host or a half-open connection, so the deadlines in
// the rendezvous code alone cannot end the wait. A StartupDeadline watches from a
// thread of its own: if it is still armed at its deadline it prints what the rank
// waited for and ends the process with kStartupExitCode. Nothing is saved during
// start-up, so ending the process loses nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace mmsp::dist {

// Exit status of a rank whose start-up ran out of time (as every start-up error: 2).
constexpr int kStartupExitCode = 2;

// Slack after the caller's own deadline: the rendezvous' own checks, which name the
// missing ranks, report first whenever the store still answers.
constexpr std::chrono::milliseconds kStartupSlack{2000};

class StartupDeadline {
 public:
  // `rank` and `where` (host:port) go into the message; the process ends `limit` +
  // kStartupSlack from now, and the message says the start-up did not finish within `limit`.
  StartupDeadline(int rank, std::chrono::milliseconds limit, std::string where, const char* first_stage);
  // Disarms (the start-up finished, or failed with an error of its own).
  ~StartupDeadline();
  StartupDeadline(const StartupDeadline&) = delete;
  StartupDeadline& operator=(const StartupDeadline&) = delete;

  // What the rank waits for now ("connecting to rank 0's store"): a string literal.
  void stage(const char* what) { stage_.store(what); }

  // "rank 0 did not join within 5 s: rank 1 is still connecting to rank 0's store at
  // host:port, which does not answer (...)", or for later stages "rank 1: start-up did not
  // finish within 5 s: still <stage> at host:port, and the peer does not answer (...)".
  static std::string message(int rank, double seconds, const std::string& stage, const std::string& where);

  // The first stage of a rank other than 0 (its message names rank 0 as the missing one).
  static constexpr const char* kConnecting = "connecting to rank 0's store";

 private:
  void watch(std::chrono::steady_clock::time_point deadline, double seconds);

  const int rank_;
  const std::string where_;
  std::atomic<const char*> stage_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread watcher_;
};

}  // namespace mmsp::dist
