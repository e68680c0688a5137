// The step time split (core/phase_timer.h): exclusive time per phase, precedence of
// nested phases, the backward markers of a region (model/phase_marker.h), and timers
// that are their callers' own (two at once, none when none is active).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <thread>

#include "mmsp/core/phase_timer.h"
#include "mmsp/model/phase_marker.h"

namespace mmsp {
namespace {

void busy(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Each region's wall time is measured outside the timer; the phases must partition it.
TEST(PhaseTimer, NestedScopesAreExclusiveAndFollowPrecedence) {
  PhaseTimer timer;
  const ActivePhaseTimer active(timer);
  double vision_wall = 0, inner_comm_wall = 0, attention_wall = 0, outer_comm_wall = 0;
  {
    const auto t0 = std::chrono::steady_clock::now();
    PhaseScope vision(Phase::vision);
    busy(0.01);
    {
      PhaseScope attention(Phase::attention);  // inside vision: vision's time
      busy(0.01);
    }
    {
      const auto c0 = std::chrono::steady_clock::now();
      PhaseScope comm(Phase::communication);  // communication always takes its own time
      busy(0.03);
      inner_comm_wall = since(c0);
    }
    vision_wall = since(t0);
  }
  {
    const auto t0 = std::chrono::steady_clock::now();
    PhaseScope attention(Phase::attention);
    busy(0.01);
    const auto c0 = std::chrono::steady_clock::now();
    PhaseScope comm(Phase::communication);  // pauses attention
    busy(0.03);
    outer_comm_wall = since(c0);
    attention_wall = since(t0);
  }
  const PhaseTimes t = timer.times();
  const double slack = 0.01;  // bookkeeping, or a preemption between a scope and its wall clock
  EXPECT_GE(t.vision_s, 0.02);
  EXPECT_LE(t.vision_s, vision_wall - inner_comm_wall + slack);
  EXPECT_GE(t.communication_s, 0.06);
  EXPECT_LE(t.communication_s, inner_comm_wall + outer_comm_wall + slack);
  EXPECT_GE(t.attention_s, 0.01);
  EXPECT_LE(t.attention_s, attention_wall - outer_comm_wall + slack);
  timer.reset();
  const PhaseTimes zero = timer.times();
  EXPECT_EQ(zero.vision_s + zero.attention_s + zero.communication_s, 0.0);
}

TEST(PhaseTimer, MarkersTimeTheBackwardOfARegion) {
  PhaseTimer timer;
  const ActivePhaseTimer active(timer);
  at::Tensor w = at::randn({64, 64}, at::kDouble).requires_grad_();
  at::Tensor x = model::leave_phase_in_backward(at::randn({8, 64}, at::kDouble).mm(w), Phase::vision);
  at::Tensor y = model::enter_phase_in_backward(x.tanh(), Phase::vision);
  y.sum().backward();
  EXPECT_GT(timer.times().vision_s, 0.0);  // the region's backward ran inside vision
  const double after = timer.times().vision_s;
  busy(0.01);
  EXPECT_EQ(timer.times().vision_s, after);  // and vision was left when it ended
  EXPECT_TRUE(w.grad().defined());
}

double total(const PhaseTimes& t) { return t.vision_s + t.attention_s + t.communication_s; }

// Marks with no timer active go nowhere: a timer made active later starts from zero.
TEST(PhaseTimer, NothingIsCountedWithoutAnActiveTimer) {
  ASSERT_EQ(ActivePhaseTimer::on_this_thread(), nullptr);
  PhaseTimer timer;
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
  PhaseTimer outer, inner;
  const auto start = std::chrono::steady_clock::now();
  const ActivePhaseTimer outer_active(outer);
  PhaseScope attention(Phase::attention);
  busy(0.01);
  const auto t0 = std::chrono::steady_clock::now();
  {
    const ActivePhaseTimer inner_active(inner);
    PhaseScope vision(Phase::vision);
    busy(0.02);
  }
  const double inner_wall = since(t0);
  busy(0.01);
  const PhaseTimes o = outer.times(), i = inner.times();
  const double outer_wall = since(start);
  const double slack = 0.005;  // bookkeeping between a scope and its wall clock
  EXPECT_GE(o.attention_s, 0.02);
  EXPECT_LE(o.attention_s, outer_wall - inner_wall + slack);  // the inner timer's time is not here
  EXPECT_EQ(o.vision_s, 0.0);
  EXPECT_GE(i.vision_s, 0.02);
  EXPECT_LE(i.vision_s, inner_wall);
  EXPECT_EQ(i.attention_s, 0.0);
  inner.reset();
  EXPECT_EQ(total(inner.times()), 0.0);
  EXPECT_GE(outer.times().attention_s, 0.02);  // resetting one leaves the other alone
}

// Two callers on two threads at the same time, each with its own timer.
TEST(PhaseTimer, TwoTimersOnTwoThreadsAtOnce) {
  PhaseTimer a, b;
  auto work = [](PhaseTimer& timer, Phase phase) {
    const ActivePhaseTimer active(timer);
    PhaseScope scope(phase);
    busy(0.02);
  };
  std::thread ta(work, std::ref(a), Phase::attention), tb(work, std::ref(b), Phase::communication);
  ta.join();
  tb.join();
  EXPECT_GE(a.times().attention_s, 0.02);
  EXPECT_EQ(a.times().communication_s, 0.0);
  EXPECT_GE(b.times().communication_s, 0.02);
  EXPECT_EQ(b.times().attention_s, 0.0);
}

}  // namespace
}  // namespace mmsp
