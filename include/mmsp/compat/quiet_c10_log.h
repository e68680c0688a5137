// The compat seam for c10's own logging during a call that mmsp reports itself
// (docs/building.md#libtorch-versions).
//
// LibTorch 2.x's TCPStore logs each failed connection attempt to stderr as a warning
// whose text is the whole c10::Error, backtrace included (17 frames for a rank whose
// rank 0 is missing), before it throws. mmsp turns that exception into one line that
// names the rank and the fix, so for the length of a QuietC10Log c10 logs only fatal
// messages. TORCH_CPP_LOG_LEVEL, when set, wins: the scope then changes nothing.
// Not thread-safe (one process-wide level): use it before a rank starts its threads.
#pragma once

#include <c10/util/Logging.h>

namespace mmsp::compat {

// Whether the user chose c10's log level (TORCH_CPP_LOG_LEVEL set; c10 reads it itself):
// then mmsp leaves the level alone. The entry point (cli/main.cpp) reads the environment
// and sets this once at start-up; the library reads no environment.
inline bool& c10_log_level_chosen_by_user() {
  static bool chosen = false;
  return chosen;
}

class QuietC10Log {
 public:
  QuietC10Log() : saved_(FLAGS_caffe2_log_level), active_(!c10_log_level_chosen_by_user()) {
    if (active_) FLAGS_caffe2_log_level = kFatal;
  }
  ~QuietC10Log() {
    if (active_) FLAGS_caffe2_log_level = saved_;
  }
  QuietC10Log(const QuietC10Log&) = delete;
  QuietC10Log& operator=(const QuietC10Log&) = delete;

 private:
  static constexpr int kFatal = 3;  // FATAL in c10's numbering and glog's alike
  int saved_;
  bool active_;
};

// For the rest of the process: a rank whose heartbeat lost the job's store reports that
// itself (heartbeat.h); every later store call would log the same c10 warning with its
// backtrace again. TORCH_CPP_LOG_LEVEL, when set, wins.
inline void quiet_c10_log_from_now() {
  if (!c10_log_level_chosen_by_user()) FLAGS_caffe2_log_level = 3;  // FATAL only
}

}  // namespace mmsp::compat
