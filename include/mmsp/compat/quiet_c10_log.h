// The compat seam for c10's own logging during a call that mmsp reports itself
// (docs/building.md#libtorch-versions).
//
// LibTorch 2.x's TCPStore logs each failed call to stderr as a warning whose text is the
// whole c10::Error, backtrace included (17 frames for a rank whose rank 0 is missing;
// "[c10d] recvValue failed on SocketImpl(...)" and 10 frames for a heartbeat's call to a
// store whose host has died), before it throws. mmsp turns that exception into one line that
// names the rank and the fix, so for the length of a QuietC10Log c10 logs only fatal
// messages. TORCH_CPP_LOG_LEVEL, when set, wins: the scope then changes nothing.
// c10's level is one process-wide value: scopes on several threads (the heartbeat's, the
// main thread's) nest through one count, and the level comes back when the last one ends,
// unless quiet_c10_log_from_now() was called meanwhile.
#pragma once

#include <c10/util/Logging.h>

#include <mutex>

namespace mmsp::compat {

// Whether the user chose c10's log level (TORCH_CPP_LOG_LEVEL set; c10 reads it itself):
// then mmsp leaves the level alone. The entry point (cli/main.cpp) reads the environment
// and sets this once at start-up; the library reads no environment.
inline bool& c10_log_level_chosen_by_user() {
  static bool chosen = false;
  return chosen;
}

namespace detail {
struct QuietState {
  std::mutex mutex;
  int scopes = 0;         // QuietC10Log scopes open, on any thread
  int saved = 0;          // the level before the first of them
  bool for_good = false;  // quiet_c10_log_from_now() was called
};
inline QuietState& quiet_state() {
  static QuietState state;
  return state;
}
constexpr int kFatal = 3;  // FATAL in c10's numbering and glog's alike
}  // namespace detail

class QuietC10Log {
 public:
  QuietC10Log() : active_(!c10_log_level_chosen_by_user()) {
    if (!active_) return;
    detail::QuietState& s = detail::quiet_state();
    const std::lock_guard<std::mutex> lock(s.mutex);
    if (s.scopes++ == 0) s.saved = FLAGS_caffe2_log_level;
    FLAGS_caffe2_log_level = detail::kFatal;
  }
  ~QuietC10Log() {
    if (!active_) return;
    detail::QuietState& s = detail::quiet_state();
    const std::lock_guard<std::mutex> lock(s.mutex);
    if (--s.scopes == 0 && !s.for_good) FLAGS_caffe2_log_level = s.saved;
  }
  QuietC10Log(const QuietC10Log&) = delete;
  QuietC10Log& operator=(const QuietC10Log&) = delete;

 private:
  bool active_;
};

// For the rest of the process: a rank whose heartbeat lost the job's store reports that
// itself (heartbeat.h); every later store call would log the same c10 warning with its
// backtrace again. TORCH_CPP_LOG_LEVEL, when set, wins.
inline void quiet_c10_log_from_now() {
  if (c10_log_level_chosen_by_user()) return;
  detail::QuietState& s = detail::quiet_state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.for_good = true;
  FLAGS_caffe2_log_level = detail::kFatal;
}

}  // namespace mmsp::compat
