// The step time split (core/phase_timer.h): exclusive time per phase, precedence of
// nested phases, and the backward markers of a region (model/phase_marker.h).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
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
  phase_reset();
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
  const PhaseTimes t = phase_times();
  const double slack = 0.01;  // bookkeeping, or a preemption between a scope and its wall clock
  EXPECT_GE(t.vision_s, 0.02);
  EXPECT_LE(t.vision_s, vision_wall - inner_comm_wall + slack);
  EXPECT_GE(t.communication_s, 0.06);
  EXPECT_LE(t.communication_s, inner_comm_wall + outer_comm_wall + slack);
  EXPECT_GE(t.attention_s, 0.01);
  EXPECT_LE(t.attention_s, attention_wall - outer_comm_wall + slack);
  phase_reset();
  const PhaseTimes zero = phase_times();
  EXPECT_EQ(zero.vision_s + zero.attention_s + zero.communication_s, 0.0);
}

TEST(PhaseTimer, MarkersTimeTheBackwardOfARegion) {
  phase_reset();
  at::Tensor w = at::randn({64, 64}, at::kDouble).requires_grad_();
  at::Tensor x = model::leave_phase_in_backward(at::randn({8, 64}, at::kDouble).mm(w), Phase::vision);
  at::Tensor y = model::enter_phase_in_backward(x.tanh(), Phase::vision);
  y.sum().backward();
  EXPECT_GT(phase_times().vision_s, 0.0);                 // the region's backward ran inside vision
  const double after = phase_times().vision_s;
  busy(0.01);
  EXPECT_EQ(phase_times().vision_s, after);  // and vision was left when it ended
  EXPECT_TRUE(w.grad().defined());
  phase_reset();
}

}  // namespace
}  // namespace mmsp
