// Where a step's wall time goes: vision encoding, attention kernels, communication.
// Code marks its phases with PhaseScope; the trainer reads the totals once per step
// and calls the rest "other". Time is exclusive: each instant belongs to one phase.
// A scope inside a phase of higher precedence adds nothing (attention kernels inside
// the vision encoder are vision time), except communication, which always takes its
// time (exposed communication, wherever it waits).
//
// Host wall time: on CPU that is the work itself; on CUDA it is launch time unless the
// caller synchronises, so the split is only meaningful on CPU today.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

namespace mmsp {

enum class Phase : int { attention = 0, vision = 1, communication = 2 };
inline constexpr int kPhaseCount = 3;

namespace detail {
using PhaseClock = std::chrono::steady_clock;

struct PhaseFrame {
  Phase phase;
  bool counting;  // false when shadowed by an enclosing phase of higher precedence
};

inline std::array<std::atomic<int64_t>, kPhaseCount> phase_nanos{};  // all threads
inline thread_local std::vector<PhaseFrame> phase_stack;
inline thread_local PhaseClock::time_point phase_since;

inline int precedence(Phase p) { return static_cast<int>(p); }

// The phase that owns this thread's time now, or -1.
inline int counting_phase() {
  for (auto it = phase_stack.rbegin(); it != phase_stack.rend(); ++it)
    if (it->counting) return static_cast<int>(it->phase);
  return -1;
}

// Charges the time since the last switch to the phase that owned it.
inline void charge_until(PhaseClock::time_point now) {
  const int owner = counting_phase();
  if (owner >= 0)
    phase_nanos[owner] += std::chrono::duration_cast<std::chrono::nanoseconds>(now - phase_since).count();
  phase_since = now;
}
}  // namespace detail

// Enters a phase on this thread; leave it with phase_leave (or use PhaseScope).
// For regions that begin and end in different functions (e.g. an autograd backward).
inline void phase_enter(Phase phase) {
  using namespace detail;
  const auto now = PhaseClock::now();
  charge_until(now);
  const int owner = counting_phase();
  const bool counting = phase == Phase::communication || owner < 0 || precedence(phase) >= precedence(Phase(owner));
  phase_stack.push_back({phase, counting});
}

// Leaves the innermost frame of `phase` (a mismatched leave is ignored, so a region
// whose end marker never ran cannot corrupt later steps; phase_reset clears it).
inline void phase_leave(Phase phase) {
  using namespace detail;
  for (auto it = phase_stack.rbegin(); it != phase_stack.rend(); ++it) {
    if (it->phase != phase) continue;
    charge_until(PhaseClock::now());
    phase_stack.erase(std::next(it).base());
    return;
  }
}

class PhaseScope {
 public:
  explicit PhaseScope(Phase phase) : phase_(phase) { phase_enter(phase); }
  ~PhaseScope() { phase_leave(phase_); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase phase_;
};

struct PhaseTimes {
  double attention_s = 0, vision_s = 0, communication_s = 0;
};

// Totals since the last reset, over every thread.
inline PhaseTimes phase_times() {
  detail::charge_until(detail::PhaseClock::now());
  auto s = [](Phase p) { return detail::phase_nanos[static_cast<int>(p)].load() * 1e-9; };
  return {s(Phase::attention), s(Phase::vision), s(Phase::communication)};
}

// Zeroes the totals and forgets this thread's open frames (call between steps).
inline void phase_reset() {
  for (auto& n : detail::phase_nanos) n = 0;
  detail::phase_stack.clear();
  detail::phase_since = detail::PhaseClock::now();
}

}  // namespace mmsp
