// Where a step's wall time goes: vision encoding, attention kernels, communication.
// A caller owns a PhaseTimer and makes it active on its thread (ActivePhaseTimer);
// code marks its phases with PhaseScope, which charges the timer active on its thread,
// or nothing when none is. The trainer reads the totals once per step and calls the
// rest "other". Time is exclusive: each instant belongs to one phase. A scope inside a
// phase of higher precedence adds nothing (attention kernels inside the vision encoder
// are vision time), except communication, which always takes its time (exposed
// communication, wherever it waits).
//
// Why a thread-local pointer to the caller's timer rather than a timer argument: the
// marks sit deep in the kernels, collectives and autograd backward functions, which
// have no caller-owned context to carry one; the totals still live in the caller's
// object, so two timers (two models in one process, a Python binding) never mix.
// A thread that has no timer active (another caller's thread, a CUDA autograd worker)
// counts nothing.
//
// Host wall time: on CPU that is the work itself; on CUDA it is launch time unless the
// caller synchronises, so the split is only meaningful on CPU today. The clock is the
// timer's (steady_clock unless its owner gives another: the tests drive a fake one, so
// they assert exact totals instead of sleeping).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

namespace mmsp {

enum class Phase : int { attention = 0, vision = 1, communication = 2 };
inline constexpr int kPhaseCount = 3;

struct PhaseTimes {
  double attention_s = 0, vision_s = 0, communication_s = 0;
};

class ActivePhaseTimer;

// The totals of one caller (a training run, a benchmark), over every thread on which it
// was active.
class PhaseTimer {
 public:
  // Nanoseconds on some monotonic clock; a plain function, as it runs at every phase mark.
  using Clock = int64_t (*)();
  static int64_t steady_nanos() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  explicit PhaseTimer(Clock clock = &steady_nanos) : clock_(clock) {}
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  // Totals since the last reset (the calling thread's open phase counted up to now).
  inline PhaseTimes times();
  // Zeroes the totals and forgets the calling thread's open phases (call between steps).
  inline void reset();

 private:
  friend class ActivePhaseTimer;
  Clock clock_;
  std::array<std::atomic<int64_t>, kPhaseCount> nanos_{};
};

// Makes `timer` the one this thread's phase marks charge, until it goes out of scope;
// then the timer active before (if any) is active again. Scoped to the thread that
// creates it: create and destroy it on the same thread.
class ActivePhaseTimer {
 public:
  inline explicit ActivePhaseTimer(PhaseTimer& timer);
  inline ~ActivePhaseTimer();
  ActivePhaseTimer(const ActivePhaseTimer&) = delete;
  ActivePhaseTimer& operator=(const ActivePhaseTimer&) = delete;

  // The active timer's side of phase_enter / phase_leave / PhaseTimer::times / reset.
  inline void enter(Phase phase);
  inline void leave(Phase phase);
  inline void charge_until_now();
  inline void forget_open_phases();
  PhaseTimer& timer() const { return timer_; }

  // The one active on this thread, or nullptr.
  static ActivePhaseTimer* on_this_thread() { return current(); }

 private:
  struct Frame {
    Phase phase;
    bool counting;  // false when shadowed by an enclosing phase of higher precedence
  };
  static ActivePhaseTimer*& current() {
    static thread_local ActivePhaseTimer* active = nullptr;
    return active;
  }
  // The phase that owns this thread's time now, or -1.
  int counting_phase() const {
    for (auto it = stack_.rbegin(); it != stack_.rend(); ++it)
      if (it->counting) return static_cast<int>(it->phase);
    return -1;
  }
  int64_t now() const { return timer_.clock_(); }
  // Charges the time since the last switch to the phase that owned it.
  void charge_until(int64_t now) {
    const int owner = counting_phase();
    if (owner >= 0) timer_.nanos_[owner] += now - since_;
    since_ = now;
  }

  PhaseTimer& timer_;
  ActivePhaseTimer* previous_;
  std::vector<Frame> stack_;
  int64_t since_;
};

ActivePhaseTimer::ActivePhaseTimer(PhaseTimer& timer) : timer_(timer), previous_(current()), since_(now()) {
  if (previous_) previous_->charge_until_now();  // the time from now on is this timer's
  current() = this;
}

ActivePhaseTimer::~ActivePhaseTimer() {
  charge_until_now();
  current() = previous_;
  if (previous_) previous_->since_ = previous_->now();  // the time under this one was not the previous one's
}

void ActivePhaseTimer::enter(Phase phase) {
  charge_until(now());
  const int owner = counting_phase();
  const bool counting = phase == Phase::communication || owner < 0 || static_cast<int>(phase) >= owner;
  stack_.push_back({phase, counting});
}

// A mismatched leave is ignored, so a region whose end marker never ran cannot corrupt
// later steps; reset() clears it.
void ActivePhaseTimer::leave(Phase phase) {
  for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) {
    if (it->phase != phase) continue;
    charge_until(now());
    stack_.erase(std::next(it).base());
    return;
  }
}

void ActivePhaseTimer::charge_until_now() { charge_until(now()); }

void ActivePhaseTimer::forget_open_phases() {
  stack_.clear();
  since_ = now();
}

PhaseTimes PhaseTimer::times() {
  ActivePhaseTimer* active = ActivePhaseTimer::on_this_thread();
  if (active && &active->timer() == this) active->charge_until_now();
  auto s = [this](Phase p) { return nanos_[static_cast<int>(p)].load() * 1e-9; };
  return {s(Phase::attention), s(Phase::vision), s(Phase::communication)};
}

void PhaseTimer::reset() {
  for (auto& n : nanos_) n = 0;
  ActivePhaseTimer* active = ActivePhaseTimer::on_this_thread();
  if (active && &active->timer() == this) active->forget_open_phases();
}

// Enters a phase on this thread's active timer (if any); leave it with phase_leave (or
// use PhaseScope). For regions that begin and end in different functions (e.g. an
// autograd backward).
inline void phase_enter(Phase phase) {
  if (ActivePhaseTimer* active = ActivePhaseTimer::on_this_thread()) active->enter(phase);
}

// Leaves the innermost open frame of `phase` on this thread's active timer (if any).
inline void phase_leave(Phase phase) {
  if (ActivePhaseTimer* active = ActivePhaseTimer::on_this_thread()) active->leave(phase);
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

}  // namespace mmsp
