// Warm-up + cosine learning rate; see lr_schedule.h.
#include "mmsp/train/optim/lr_schedule.h"

#include <cmath>

#include "mmsp/core/check.h"

namespace mmsp::train {

void LrSchedule::validate() const {
  MMSP_CHECK(std::isfinite(lr) && lr > 0, "learning-rate schedule: lr (", lr, ") must be a positive finite number");
  MMSP_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr, "learning-rate schedule: min_lr (", min_lr,
             ") must be in [0, lr (", lr, ")]");
  MMSP_CHECK(total_steps >= 1, "learning-rate schedule: total_steps (", total_steps, ") must be at least 1");
  MMSP_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps, "learning-rate schedule: warmup_steps (", warmup_steps,
             ") must be in [0, total_steps (", total_steps, ")]");
}

double LrSchedule::at(int64_t step) const {
  validate();
  MMSP_CHECK(step >= 0, "learning-rate schedule: step (", step, ") must be ≥ 0");
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (step >= total_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace mmsp::train
