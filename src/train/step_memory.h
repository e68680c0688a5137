// The per-step memory preflight: the run's estimate with this step's vision tower (the
// busiest rank's, which every rank computes alike from the plan) and its padded slots, so
// that a step too large for the limit (a long video encoded whole) fails on every rank
// before its first collective. Private to train/.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "mmsp/plan/step_plan.h"
#include "mmsp/train/memory/memory_estimate.h"
#include "pixel_prefetch.h"
#include "run_inputs.h"

namespace mmsp::train {

// Checks step `step` against o.memory.limit_bytes (an error naming the step, its samples
// and what is large); `largest` keeps the largest estimate of the run (the figure bench
// memory compares with the peak). `next` (--prefetch-pixels): on the CPU its pixels,
// decoded during this step, count too (the largest any rank decodes, which every rank
// computes alike); when they alone would take the step past the limit, `next` is dropped:
// the next step loads its own.
void check_step_memory(const TrainOptions& o, const RunInputs& in, const plan::Mesh& mesh, int64_t step,
                       const std::vector<int64_t>& samples, const plan::StepPlan& plan, MemoryEstimate& largest,
                       std::optional<NextStep>& next);

}  // namespace mmsp::train
