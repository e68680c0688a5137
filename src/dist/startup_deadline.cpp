// The start-up watchdog; see startup_deadline.h.
#include "mmsp/dist/startup_deadline.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace mmsp::dist {

StartupDeadline::StartupDeadline(int rank, std::chrono::milliseconds limit, std::string where, const char* first_stage)
    : rank_(rank), where_(std::move(where)), stage_(first_stage) {
  const auto deadline = std::chrono::steady_clock::now() + limit + kStartupSlack;
  const double seconds = static_cast<double>(limit.count()) / 1000.0;
  watcher_ = std::thread([this, deadline, seconds] { watch(deadline, seconds); });
}

StartupDeadline::~StartupDeadline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  wake_.notify_all();
  watcher_.join();
}

std::string StartupDeadline::message(int rank, double seconds, const std::string& stage, const std::string& where) {
  std::ostringstream out;
  if (stage == kConnecting)
    out << "rank 0 did not join within " << seconds << " s: rank " << rank << " is still " << stage << " at " << where
        << ", which does not answer (is rank 0 started and running, with the same MASTER_ADDR and MASTER_PORT? "
           "is another program listening on that port?); --timeout bounds the start-up";
  else
    out << "rank " << rank << ": start-up did not finish within " << seconds << " s: still " << stage << " at " << where
        << ", and the peer does not answer (a stopped or hung rank 0, or a network that drops the "
        << "connection); --timeout bounds the start-up";
  return out.str();
}

void StartupDeadline::watch(std::chrono::steady_clock::time_point deadline, double seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (wake_.wait_until(lock, deadline, [this] { return done_; })) return;
  // The main thread is blocked in a call that has no deadline of its own: report
  // and end the process from here (exceptions cannot reach that thread).
  const std::string text = message(rank_, seconds, stage_.load(), where_);
  std::fprintf(stderr, "mmsp: error: %s\n", text.c_str());
  std::fflush(stderr);
  std::_Exit(kStartupExitCode);
}

}  // namespace mmsp::dist
