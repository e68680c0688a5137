// The step time split (core/phase_timer.h): exclusive time per phase, precedence of
// nested phases, the backward markers of a region (model/phase_marker.h), and timers
// that are their callers' own (two at once, none when none is active). The timers run on
// a fake clock that the test moves (one per thread; each reading ticks it by 1 ns, so a
// mark that read the clock shows), so every total is asserted exactly and nothing sleeps.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <thread>

#include "mmsp/core/phase_timer.h"
#include "mmsp/model/phase_marker.h"

namespace mmsp {
namespace {

thread_local int64_t fake_nanos = 0;
int64_t fake_clock() { return ++fake_nanos; }
// Moves this thread's fake clock on by `seconds` (what a phase's work would take).
void busy(double seconds) { fake_nanos += static_cast<int64_t>(seconds * 1e9); }

// The ticks of the clock's readings (1 ns each) are all a total may carry beyond the work.
constexpr double kTicks = 1e-6;

TEST(PhaseTimer, NestedScopesAreExclusiveAndFollowPrecedence) {
  PhaseTimer timer(&fake_clock);
  const ActivePhaseTimer active(timer);
  {
    PhaseScope vision(Phase::vision);
    busy(0.01);
    {
      PhaseScope attention(Phase::attention);  // inside vision: vision's time
      busy(0.01);
    }
    {
      PhaseScope comm(Phase::communication);  // communication always takes its own time
      busy(0.03);
    }
  }
  {
    PhaseScope attention(Phase::attention);
    busy(0.01);
    PhaseScope comm(Phase::communication);  // pauses attention
    busy(0.03);
  }
  const PhaseTimes t = timer.times();
  EXPECT_NEAR(t.vision_s, 0.02, kTicks);
  EXPECT_NEAR(t.communication_s, 0.06, kTicks);
  EXPECT_NEAR(t.attention_s, 0.01, kTicks);
  timer.reset();
  const PhaseTimes zero = timer.times();
  EXPECT_EQ(zero.vision_s + zero.attention_s + zero.communication_s, 0.0);
}

TEST(PhaseTimer, MarkersTimeTheBackwardOfARegion) {
  PhaseTimer timer(&fake_clock);
  const ActivePhaseTimer active(timer);
  at::Tensor w = at::randn({64, 64}, at::kDouble).requires_grad_();
  at::Tensor x = model::leave_phase_in_backward(at::randn({8, 64}, at::kDouble).mm(w), Phase::vision);
  at::Tensor y = model::enter_phase_in_backward(x.tanh(), Phase::vision);
  y.sum().backward();
  EXPECT_GT(timer.times().vision_s, 0.0);  // the region's backward ran inside vision (its marks read the clock)
  const double after = timer.times().vision_s;
  busy(0.01);
  EXPECT_EQ(timer.times().vision_s, after);  // and vision was left when it ended
  EXPECT_TRUE(w.grad().defined());
}

double total(const PhaseTimes& t) { return t.vision_s + t.attention_s + t.communication_s; }

// Marks with no timer active go nowhere: a timer made active later starts from zero.
TEST(PhaseTimer, NothingIsCountedWithoutAnActiveTimer) {
  ASSERT_EQ(ActivePhaseTimer::on_this_thread(), nullptr);
  PhaseTimer timer(&fake_clock);
  {
    PhaseScope attention(Phase::attention);
    busy(0.01);
  }
  EXPECT_EQ(total(timer.times()), 0.0);
  phase_enter(Phase::vision);  // and a region left open then does not leak into it
  const ActivePhaseTimer active(timer);
  busy(0.01);
  EXPECT_EQ(total(timer.times()), 0.0);
  phase_leave(Phase::vision);
}

// A timer made active inside another's takes this thread's time until it ends; each
// keeps its own totals, and the outer one resumes without the inner one's time.
TEST(PhaseTimer, TwoTimersNestedOnOneThreadKeepTheirOwnTotals) {
  PhaseTimer outer(&fake_clock), inner(&fake_clock);
  const ActivePhaseTimer outer_active(outer);
  PhaseScope attention(Phase::attention);
  busy(0.01);
  {
    const ActivePhaseTimer inner_active(inner);
    PhaseScope vision(Phase::vision);
    busy(0.02);
  }
  busy(0.01);
  const PhaseTimes o = outer.times(), i = inner.times();
  EXPECT_NEAR(o.attention_s, 0.02, kTicks);  // the inner timer's time is not here
  EXPECT_EQ(o.vision_s, 0.0);
  EXPECT_NEAR(i.vision_s, 0.02, kTicks);
  EXPECT_EQ(i.attention_s, 0.0);
  inner.reset();
  EXPECT_EQ(total(inner.times()), 0.0);
  EXPECT_NEAR(outer.times().attention_s, 0.02, kTicks);  // resetting one leaves the other alone
}

// Two callers on two threads at the same time, each with its own timer (and, here, its
// thread's own fake clock).
TEST(PhaseTimer, TwoTimersOnTwoThreadsAtOnce) {
  PhaseTimer a(&fake_clock), b(&fake_clock);
  auto work = [](PhaseTimer& timer, Phase phase, double seconds) {
    const ActivePhaseTimer active(timer);
    PhaseScope scope(phase);
    busy(seconds);
  };
  std::thread ta(work, std::ref(a), Phase::attention, 0.02), tb(work, std::ref(b), Phase::communication, 0.03);
  ta.join();
  tb.join();
  EXPECT_NEAR(a.times().attention_s, 0.02, kTicks);
  EXPECT_EQ(a.times().communication_s, 0.0);
  EXPECT_NEAR(b.times().communication_s, 0.03, kTicks);
  EXPECT_EQ(b.times().attention_s, 0.0);
}

// The default clock is the steady clock: a real phase takes real time.
TEST(PhaseTimer, TheDefaultClockIsSteady) {
  PhaseTimer timer;
  const ActivePhaseTimer active(timer);
  {
    PhaseScope attention(Phase::attention);
    const int64_t t0 = PhaseTimer::steady_nanos();  // after the scope read the clock
    while (PhaseTimer::steady_nanos() - t0 < 1000) {}
  }
  EXPECT_GE(timer.times().attention_s, 1e-6);
}

}  // namespace
}  // namespace mmsp
