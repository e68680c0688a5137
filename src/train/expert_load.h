// A mixture-of-experts step's load for the metrics (metrics.h's expert_tokens,
// expert_imbalance, hot_expert), from the step's routing counts of every rank (the same
// on every rank: model::StepOutput::expert_counts). Private to train/.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "mmsp/train/metrics.h"

namespace mmsp::train {

// `counts` [sparse layers, E]: the (token, expert) picks of each layer; `expert_ranks`:
// the expert group's size (each rank holds E / expert_ranks consecutive experts).
void add_expert_load(StepMetrics& m, const at::Tensor& counts, int64_t expert_ranks);

}  // namespace mmsp::train
