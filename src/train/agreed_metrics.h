// One step's figures as every rank agrees on them (one all-reduce): the loss (and an RL
// objective's figures) summed over the world, the slowest rank's time and its split (a partition of it), the largest
// memory, and the busiest sender's bytes and their split (a partition of them).
// Private to train/.
#pragma once

#include <map>
#include <string>

#include "mmsp/dist/mesh.h"
#include "mmsp/plan/step_plan.h"
#include "mmsp/train/metrics.h"
#include "mmsp/train/step_watch.h"

namespace mmsp::train {

// `objective`: the rank's shares of an RL objective's figures (StepMetrics::objective),
// summed over the world with the loss.
StepMetrics agreed_metrics(int64_t step, double local_loss, std::map<std::string, double> objective, double lr,
                           double grad_norm, const plan::Batch& batch, const plan::StepPlan& plan,
                           const StepAccount& account, const dist::Mesh& mesh);

}  // namespace mmsp::train
