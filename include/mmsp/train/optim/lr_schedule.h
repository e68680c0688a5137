// Learning-rate schedule: linear warm-up, then cosine decay to a floor. A pure
// function of the step; the trainer applies it with set_lr (optimizer.h).
#pragma once

#include <cstdint>

namespace mmsp::train {

// Steps count from 0 (the first optimiser step is step 0). With W = warmup_steps,
// T = total_steps:
//   step < W:       lr · (step + 1) / W          (step 0 gets lr / W, step W−1 gets lr)
//   W ≤ step < T:   min_lr + (lr − min_lr) · ½ (1 + cos(π · (step − W) / (T − W)))
//   step ≥ T:       min_lr
// So step W gets lr again (the top of the cosine) and step T is the first at min_lr.
// W = 0 means no warm-up.
struct LrSchedule {
  double lr = 1e-4;          // peak learning rate, > 0
  double min_lr = 0.0;       // floor reached at total_steps, 0 ≤ min_lr ≤ lr
  int64_t warmup_steps = 0;  // 0 ≤ warmup_steps ≤ total_steps
  int64_t total_steps = 1;   // ≥ 1

  // Throws mmsp::Error naming the first bad field and the rule.
  void validate() const;
  // The learning rate of optimiser step `step` (≥ 0); validates first.
  double at(int64_t step) const;
};

}  // namespace mmsp::train
