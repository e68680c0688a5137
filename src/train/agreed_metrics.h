// One step's figures as every rank agrees on them (one all-reduce): the loss summed over
// the world, the slowest rank's time and its split (a partition of it), the largest
// memory, and the busiest sender's bytes and their split (a partition of them).
// Private to train/.
#pragma once

#include "mmsp/dist/mesh.h"
#include "mmsp/plan/step_plan.h"
#include "mmsp/train/metrics.h"
#include "mmsp/train/step_watch.h"

namespace mmsp::train {

StepMetrics agreed_metrics(int64_t step, double local_loss, double lr, double grad_norm, const plan::Batch& batch,
                           const plan::StepPlan& plan, const StepAccount& account, const dist::Mesh& mesh);

}  // namespace mmsp::train
